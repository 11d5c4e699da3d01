"""headroom.quantity against apimachinery's grammar and the official client."""

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as reference

from headroom.quantity import (
    GIB,
    MIB,
    QuantityError,
    format_bytes,
    human_bytes,
    parse_bytes,
    parse_quantity,
)

SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"]

numbers = st.builds(
    lambda sign, whole, frac: f"{sign}{whole}{frac}",
    st.sampled_from(["", "+", "-"]),
    st.integers(min_value=0, max_value=10**12).map(str),
    st.one_of(st.just(""), st.just("."), st.integers(0, 999_999).map(lambda f: f".{f}")),
)
quantities = st.one_of(
    st.builds(lambda n, s: n + s, numbers, st.sampled_from(SUFFIXES)),
    st.builds(lambda n, e: f"{n}e{e}", numbers, st.integers(-20, 20)),
    st.builds(lambda n, e: f"{n}E{e:+d}", numbers, st.integers(-20, 20)),
)


@given(quantities)
def test_agrees_with_the_official_client_on_every_valid_quantity(text: str) -> None:
    assert parse_quantity(text) == reference(text)


@given(st.text(alphabet="0123456789.+-eEKkMGTPEimnu ", max_size=12))
def test_whatever_it_accepts_the_official_client_reads_the_same(text: str) -> None:
    try:
        ours = parse_quantity(text)
    except QuantityError:
        return
    assert ours == reference(text)


@pytest.mark.parametrize("text", [" 1Gi", "1Gi ", " 4Gi ", "0E ", "\t8G", "10Gi\n", "1\n"])
def test_surrounding_whitespace_is_refused_as_apimachinery_does(text: str) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(text)


@given(st.integers(min_value=-(2**62), max_value=2**62))
def test_integers_are_taken_as_they_are(value: int) -> None:
    assert parse_quantity(value) == reference(value) == Decimal(value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10Gi", 10 * GIB),
        ("512Mi", 512 * MIB),
        ("8G", 8 * 10**9),
        ("1.5Gi", 3 * GIB // 2),
        ("1e9", 10**9),
        ("1E+3", 1000),
        (".5Ki", 512),
        ("100m", Decimal("0.1")),
    ],
)
def test_examples(text: str, expected: Decimal | int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text",
    # The client accepts several of these ("1K", "1_000", "NaN", "1e3Ki");
    # apimachinery does not, and the apiserver is what pods are checked against.
    [
        "10Gx",
        "",
        "Gi",
        "1.2.3",
        "1ki",
        "1K",
        "1_000",
        "NaN",
        "Infinity",
        "1e3Ki",
        "--1",
        "1e",
        "x" * 80,
    ],
)
def test_rejects_what_apimachinery_rejects(text: str) -> None:
    with pytest.raises(QuantityError, match="quantity"):
        parse_quantity(text)


def test_a_number_too_long_to_read_is_named_as_such() -> None:
    huge = str(2**256 + 1)  # 78 digits: the apiserver stores it
    with pytest.raises(QuantityError, match="is too long to read \\(78 characters, at most 64\\)"):
        parse_quantity(huge)


def test_booleans_are_not_quantities() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)


def test_parse_bytes_rounds_up_and_refuses_negative_or_huge() -> None:
    assert parse_bytes("1.5") == 2
    assert parse_bytes("100m") == 1
    with pytest.raises(QuantityError, match="negative"):
        parse_bytes("-1Gi")
    with pytest.raises(QuantityError, match="range"):
        parse_bytes("16Ei")


@given(st.integers(min_value=0, max_value=2**62))
def test_format_bytes_round_trips(amount: int) -> None:
    text = format_bytes(amount)
    assert parse_bytes(text) == amount
    assert parse_quantity(text) == reference(text)


@pytest.mark.parametrize(
    ("amount", "text"), [(0, "0"), (10 * GIB, "10Gi"), (1536 * MIB, "1536Mi"), (1000, "1000")]
)
def test_format_bytes_picks_the_largest_exact_unit(amount: int, text: str) -> None:
    assert format_bytes(amount) == text


def test_human_bytes_is_for_people() -> None:
    assert human_bytes(6 * GIB) == "6.0 GiB"
    assert human_bytes(512) == "512 B"
    assert human_bytes(-3 * MIB) == "-3.0 MiB"
