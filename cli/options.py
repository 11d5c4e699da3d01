"""Argument types and options the commands share."""

import argparse
import logging
import re

from headroom.quantity import QuantityError, parse_bytes

_DURATION = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>ms|s|m|h)?$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """``5s``, ``500ms``, ``2m``, or plain seconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (expected e.g. 5s, 500ms, 1m)"
        )
    seconds = float(match["number"]) * _UNIT_SECONDS[match["unit"] or "s"]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be positive")
    return seconds


def memory(text: str) -> int:
    """A memory quantity (``512Mi``, ``1G``) in bytes."""
    try:
        return parse_bytes(text)
    except QuantityError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def port(text: str) -> int:
    """A TCP port number, 1..65535."""
    try:
        number = int(text)
    except ValueError:
        number = -1
    if not 0 < number < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return number


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def lease(text: str) -> str:
    """``namespace/name`` of a Lease."""
    namespace, slash, name = text.partition("/")
    if not slash or not _DNS_LABEL.match(namespace) or not _DNS_SUBDOMAIN.match(name):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Lease as namespace/name (e.g. headroom-system/headroom-scheduler)"
        )
    return text


def add_kubeconfig(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig PATH``, resolved by :func:`kube.config.api_client`."""
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG)",
    )


def quiet_retries() -> None:
    """The official client retries a refused or broken connection three times, with a
    warning each; a one-shot command that then gives up says why in one line itself."""
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def one_line(err: BaseException) -> str:
    """An exception's text on one line (urllib3 and the apiserver's can span several)."""
    return " ".join(str(err).split())
