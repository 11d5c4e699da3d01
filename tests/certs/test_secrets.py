"""The decisions behind ``headroom certs secret``, on plain Secret data (no API).
(Against a real apiserver: tests/e2e/test_certificates.py.)"""

import base64
import datetime
import ipaddress
from collections.abc import Callable, Mapping

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from certs.generate import Issuer, key_pem, service_names
from certs.secrets import (
    TLS_TYPE,
    SecretError,
    SecretState,
    ServingSpec,
    Verdict,
    check_serving,
    decode_secret,
    issue_ca,
    issue_serving,
    load_ca,
    secret_body,
)

NOW = datetime.datetime(2030, 6, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
NAMES = tuple(service_names("headroom-webhook", "headroom-system"))
SPEC = ServingSpec(NAMES, (ipaddress.ip_address("127.0.0.1"),), renew_before=30 * DAY)


def state(data: Mapping[str, bytes], *, type_: str = TLS_TYPE, name: str = "tls") -> SecretState:
    return SecretState("headroom-system", name, type_, dict(data), "7")


@pytest.fixture(scope="module")
def ca() -> tuple[Issuer, dict[str, bytes]]:
    return issue_ca("test CA", NOW - 400 * DAY)


@pytest.fixture(scope="module")
def issuer(ca: tuple[Issuer, dict[str, bytes]]) -> Issuer:
    return ca[0]


def serving(
    issuer: Issuer, *, spec: ServingSpec = SPEC, at: datetime.datetime = NOW
) -> SecretState:
    return state(issue_serving(issuer, spec, at)[1])


# --- the CA Secret ---------------------------------------------------------------------


def test_a_well_formed_ca_secret_is_loaded(ca: tuple[Issuer, dict[str, bytes]]) -> None:
    loaded = load_ca(state(ca[1], type_="Opaque", name="ca"), NOW, 30 * DAY)

    assert loaded.certificate == ca[0].certificate


def test_a_ca_key_that_does_not_match_ca_crt_is_an_error_naming_both(
    ca: tuple[Issuer, dict[str, bytes]],
) -> None:
    other = key_pem(ec.generate_private_key(ec.SECP256R1()))

    with pytest.raises(
        SecretError, match=r"Secret headroom-system/ca: ca.key does not match ca.crt"
    ):
        load_ca(state({**ca[1], "ca.key": other}, name="ca"), NOW, 30 * DAY)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ca.key", None, r"data.ca.key is missing"),
        ("ca.crt", None, r"data.ca.crt is missing"),
        ("ca.crt", b"-----BEGIN CERTIFICATE-----\nnope\n", r"data.ca.crt is not a PEM certificate"),
        ("ca.key", b"not a key", r"data.ca.key is not a PEM private key"),
    ],
)
def test_a_malformed_ca_secret_is_an_error_naming_the_field(
    ca: tuple[Issuer, dict[str, bytes]], field: str, value: bytes | None, message: str
) -> None:
    data = dict(ca[1])
    if value is None:
        del data[field]
    else:
        data[field] = value

    with pytest.raises(SecretError, match=rf"Secret headroom-system/ca: {message}"):
        load_ca(state(data, name="ca"), NOW, 30 * DAY)


def test_a_serving_certificate_is_not_accepted_as_the_ca(issuer: Issuer) -> None:
    leaf = issue_serving(issuer, SPEC, NOW)[1]
    data = {"ca.crt": leaf["tls.crt"], "ca.key": leaf["tls.key"]}

    with pytest.raises(SecretError, match=r"ca\.crt is not a CA certificate"):
        load_ca(state(data, name="ca"), NOW, 30 * DAY)


def test_a_ca_expiring_within_the_window_is_an_error_not_a_silent_new_ca(
    ca: tuple[Issuer, dict[str, bytes]],
) -> None:
    expires = ca[0].certificate.not_valid_after_utc

    with pytest.raises(SecretError, match=r"expires .* delete the Secret to issue a new CA"):
        load_ca(state(ca[1], name="ca"), expires - 10 * DAY, 30 * DAY)


# --- the serving Secret -----------------------------------------------------------------


def test_a_missing_serving_secret_is_issued(issuer: Issuer) -> None:
    verdict = check_serving(None, issuer, SPEC, NOW)

    assert verdict == Verdict(True, "missing")


def test_a_fresh_serving_secret_is_kept(issuer: Issuer) -> None:
    verdict = check_serving(serving(issuer), issuer, SPEC, NOW + DAY)

    assert not verdict.reissue
    assert verdict.reason.startswith("valid until ")


def test_a_serving_secret_expiring_within_the_window_is_reissued(issuer: Issuer) -> None:
    secret = serving(issuer, at=NOW - 340 * DAY)  # 365-day cert: 25 days left

    verdict = check_serving(secret, issuer, SPEC, NOW)

    assert verdict.reissue
    assert "within the renewal window" in verdict.reason
    assert not check_serving(secret, issuer, ServingSpec(NAMES, SPEC.ips, 20 * DAY), NOW).reissue


def test_a_serving_secret_for_other_names_is_reissued(issuer: Issuer) -> None:
    other = ServingSpec(tuple(service_names("other", "headroom-system")), SPEC.ips)

    verdict = check_serving(serving(issuer, spec=other), issuer, SPEC, NOW)

    assert verdict.reissue
    assert "DNS:headroom-webhook.headroom-system.svc" in verdict.reason


def test_a_serving_secret_missing_an_ip_san_is_reissued(issuer: Issuer) -> None:
    without_ip = ServingSpec(NAMES)

    assert check_serving(serving(issuer, spec=without_ip), issuer, SPEC, NOW).reissue
    assert not check_serving(serving(issuer, spec=without_ip), issuer, without_ip, NOW).reissue


def test_a_serving_secret_signed_by_another_ca_is_reissued(issuer: Issuer) -> None:
    stranger = issue_ca("another CA", NOW)[0]

    verdict = check_serving(serving(stranger), issuer, SPEC, NOW)

    assert verdict == Verdict(True, "not signed by the current CA")


def test_a_serving_secret_whose_ca_crt_is_stale_is_reissued(issuer: Issuer) -> None:
    secret = serving(issuer)
    stale = state({**secret.data, "ca.crt": issue_serving(issuer, SPEC, NOW)[1]["tls.crt"]})

    verdict = check_serving(stale, issuer, SPEC, NOW)

    assert verdict == Verdict(True, "ca.crt is not the current CA")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("tls.crt", None, "data.tls.crt is missing"),
        ("tls.key", None, "data.tls.key is missing"),
        ("tls.crt", b"garbage", "data.tls.crt is not a PEM certificate"),
        ("tls.key", b"garbage", "data.tls.key is not a PEM private key"),
        ("tls.key", key_pem(ec.generate_private_key(ec.SECP256R1())), "tls.key does not match"),
    ],
)
def test_a_malformed_serving_secret_is_reissued_naming_the_field(
    issuer: Issuer, field: str, value: bytes | None, reason: str
) -> None:
    data = dict(serving(issuer).data)
    if value is None:
        del data[field]
    else:
        data[field] = value

    verdict = check_serving(state(data), issuer, SPEC, NOW)

    assert verdict.reissue
    assert reason in verdict.reason


def test_a_serving_secret_of_the_wrong_type_is_an_error(issuer: Issuer) -> None:
    secret = state(serving(issuer).data, type_="Opaque")

    with pytest.raises(SecretError, match=r"Secret headroom-system/tls: type is 'Opaque'"):
        check_serving(secret, issuer, SPEC, NOW)


def test_what_is_issued_passes_the_check_that_decided_to_issue_it(issuer: Issuer) -> None:
    certificate, data = issue_serving(issuer, SPEC, NOW)

    assert not check_serving(state(data), issuer, SPEC, NOW).reissue
    assert data["ca.crt"].startswith(b"-----BEGIN CERTIFICATE-----")
    assert certificate.not_valid_after_utc <= issuer.certificate.not_valid_after_utc


# --- wire form --------------------------------------------------------------------------


def test_a_secret_is_decoded_from_api_json_and_bad_base64_names_the_key() -> None:
    raw = {
        "metadata": {"name": "tls", "namespace": "ns", "resourceVersion": "12"},
        "type": TLS_TYPE,
        "data": {"tls.crt": base64.b64encode(b"pem").decode()},
    }

    decoded = decode_secret(raw)

    assert (decoded.ref, decoded.resource_version, decoded.data) == (
        "Secret ns/tls",
        "12",
        {"tls.crt": b"pem"},
    )
    with pytest.raises(SecretError, match=r"Secret ns/tls: data.tls.key is not base64"):
        decode_secret({**raw, "data": {"tls.key": "%%%"}})


def test_an_update_keeps_the_resource_version_and_foreign_metadata() -> None:
    current = decode_secret(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "tls",
                "namespace": "ns",
                "resourceVersion": "12",
                "labels": {"team": "gpu"},
                "annotations": {"note": "kept"},
            },
            "type": TLS_TYPE,
            "data": {"old": base64.b64encode(b"x").decode()},
            "stringData": {"stale": "y"},
        }
    )

    body = secret_body(
        "ns", "tls", TLS_TYPE, {"tls.crt": b"new"}, current=current, labels={"a": "b"}
    )

    assert body["metadata"]["resourceVersion"] == "12"
    assert body["metadata"]["labels"] == {"team": "gpu", "a": "b"}
    assert body["metadata"]["annotations"] == {"note": "kept"}
    assert body["data"] == {"tls.crt": base64.b64encode(b"new").decode()}
    assert "stringData" not in body
    assert "resourceVersion" not in secret_body("ns", "tls", TLS_TYPE, {})["metadata"]


def _without(data: dict[str, bytes], field: str) -> dict[str, bytes]:
    return {key: value for key, value in data.items() if key != field}


CA_EDITS: dict[str, Callable[[dict[str, bytes], dict[str, bytes]], dict[str, bytes]]] = {
    "no key": lambda data, leaf: _without(data, "ca.key"),
    "no cert": lambda data, leaf: _without(data, "ca.crt"),
    "bad cert": lambda data, leaf: {**data, "ca.crt": b"-----BEGIN CERTIFICATE-----\nnope\n"},
    "bad key": lambda data, leaf: {**data, "ca.key": b"not a key"},
    "other key": lambda data, leaf: {
        **data,
        "ca.key": key_pem(ec.generate_private_key(ec.SECP256R1())),
    },
    "a leaf": lambda data, leaf: {"ca.crt": leaf["tls.crt"], "ca.key": leaf["tls.key"]},
}


@pytest.mark.parametrize("edit", CA_EDITS.values(), ids=CA_EDITS.keys())
def test_an_unusable_ca_secret_says_what_to_do(
    ca: tuple[Issuer, dict[str, bytes]],
    issuer: Issuer,
    edit: Callable[[dict[str, bytes], dict[str, bytes]], dict[str, bytes]],
) -> None:
    # The CronJob exits 2 on it every hour: the message must say the way out.
    data = edit(dict(ca[1]), issue_serving(issuer, SPEC, NOW)[1])

    with pytest.raises(SecretError, match=r"; restore it, or delete it to issue a new CA"):
        load_ca(state(data, name="ca"), NOW, 30 * DAY)


def test_a_serving_secret_of_the_wrong_type_says_to_delete_it(issuer: Issuer) -> None:
    secret = state(serving(issuer).data, type_="Opaque")

    with pytest.raises(SecretError, match=r"; delete it .* a new one is issued"):
        check_serving(secret, issuer, SPEC, NOW)
