"""``headroom certs secret``'s arguments (what it does: tests/e2e/test_certificates.py)."""

import argparse
import datetime

import pytest

from cli.certs import add_parser, renewal_window


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["certs", "secret", *argv])


def test_defaults_name_the_manifests_secrets_and_a_30_day_window() -> None:
    args = parse("--namespace", "headroom-system", "--service", "headroom-webhook")

    assert (args.secret, args.ca_secret, args.webhook) == (
        "headroom-webhook-tls",
        "headroom-webhook-ca",
        None,
    )
    assert args.renew_before == datetime.timedelta(days=30)


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("30d", datetime.timedelta(days=30)),
        ("720h", datetime.timedelta(hours=720)),
        ("90m", datetime.timedelta(minutes=90)),
    ],
)
def test_renewal_windows_take_days_hours_or_minutes(text: str, window: datetime.timedelta) -> None:
    assert renewal_window(text) == window


@pytest.mark.parametrize("text", ["30", "1y", "-3d", "d", "1.5d"])
def test_a_window_without_a_unit_or_with_an_unknown_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        renewal_window(text)
