"""Kubernetes resource quantities (``10Gi``, ``512M``, ``1.5e9``) for memory.

``kubernetes.utils.parse_quantity`` would do, but importing it loads the whole
API client, which the core must not do. This is apimachinery's grammar
(``resource.Quantity``), which is stricter than the Python client (it accepts
``1K``, ``1_000``, ``NaN``): a property test checks the two agree on every valid
quantity, and that whatever this accepts the client reads the same way.
"""

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?\Z"
)
_MAX_LEN = 64


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity; the message quotes it."""


class QuantityTooLong(QuantityError):
    """A well-formed quantity longer than this reads (the apiserver stores it exactly)."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a quantity exactly, as apimachinery does, into a Decimal."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        return Decimal(str(value))
    # No trimming: apimachinery rejects surrounding spaces, and so does this.
    text = value
    if not isinstance(text, str) or not text:
        raise QuantityError(f"{value!r} is not a quantity")
    match = _QUANTITY.match(text)  # linear: no nested repetition to backtrack over
    if match is not None and len(text) > _MAX_LEN:
        # Well formed, and stored by the apiserver, which keeps such a number exact
        # (a review's case: 78 digits): named as too long, not as malformed.
        raise QuantityTooLong(f"{value!r} is too long to read ({len(text)} characters, at most 64)")
    if match is None or len(text) > _MAX_LEN:
        raise QuantityError(f"{value!r} is not a quantity (expected e.g. 10Gi, 512Mi, 8G)")
    try:
        number = Decimal(match["number"])
    except InvalidOperation as err:  # pragma: no cover - the regex admits only decimals
        raise QuantityError(f"{value!r} is not a quantity") from err
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > 100:
            raise QuantityError(f"{value!r} is out of range")
        return number.scaleb(exponent)
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    return number * _DECIMAL[suffix]


def parse_bytes(value: str | int | float) -> int:
    """A memory quantity in whole bytes, rounded up; negative is an error."""
    amount = parse_quantity(value)
    if amount < 0:
        raise QuantityError(f"{value!r} is negative")
    whole = int(amount.to_integral_value(rounding="ROUND_CEILING"))
    if whole >= 2**63:
        raise QuantityError(f"{value!r} is out of range")
    return whole


_UNITS = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def format_bytes(amount: int) -> str:
    """The shortest exact binary quantity: ``10737418240`` -> ``10Gi``."""
    if amount == 0:
        return "0"
    for suffix, size in _UNITS:
        if amount % size == 0:
            return f"{amount // size}{suffix}"
    return str(amount)


def human_bytes(amount: int) -> str:
    """For people, not for the apiserver: ``6442450944`` -> ``6.0 GiB``."""
    sign = "-" if amount < 0 else ""
    value = float(abs(amount))
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or suffix == "TiB":
            return f"{sign}{value:.0f} {suffix}" if suffix == "B" else f"{sign}{value:.1f} {suffix}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


MIB = 2**20
GIB = 2**30
