"""What the webhook reads of its serving certificate: serial, validity, DNS names.

OpenSSL (``ssl``) does the TLS and checks that the certificate and key match;
the webhook only needs four fields of the certificate to say whether it may
serve (webhook.tls) and when it expires (a metric). They are read here from the
DER, per RFC 5280, rather than through the ``cryptography`` package, whose
import alone is ~8 MiB of a 256Mi webhook (issue 8; bench/memory_bench.py).
Any structure this reader does not expect is a :class:`ValueError`, which the
caller turns into "not a PEM certificate", never a guess.
"""

import base64
import binascii
import datetime
import re
from dataclasses import dataclass

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s*(.+?)\s*-----END CERTIFICATE-----", re.S)
_SAN = bytes.fromhex("551d11")  # 2.5.29.17 subjectAltName, the OID's DER content
_SEQUENCE, _INTEGER, _OID, _OCTETS, _BOOLEAN = 0x30, 0x02, 0x06, 0x04, 0x01
_UTC_TIME, _GENERALIZED_TIME = 0x17, 0x18
_VERSION, _ISSUER_UID, _SUBJECT_UID, _EXTENSIONS = 0xA0, 0x81, 0x82, 0xA3
_DNS_NAME = 0x82  # GeneralName dNSName [2] IA5String


@dataclass(frozen=True)
class Certificate:
    """Named as the ``cryptography`` package names them."""

    serial_number: int
    not_valid_before_utc: datetime.datetime
    not_valid_after_utc: datetime.datetime
    dns_names: tuple[str, ...]
    """The subjectAltName extension's DNS names, as written."""


def load_pem_certificate(data: bytes) -> Certificate:
    """The first certificate of a PEM file (a chain starts with its leaf)."""
    found = _PEM.search(data)
    if found is None:
        raise ValueError("no PEM CERTIFICATE block")
    try:
        der = base64.b64decode(b"".join(found[1].split()), validate=True)
    except binascii.Error as err:
        raise ValueError(f"the PEM block is not base64: {err}") from err
    return load_der_certificate(der)


def load_der_certificate(der: bytes) -> Certificate:
    certificate = _Reader(der).one(_SEQUENCE)
    tbs = _Reader(certificate).one(_SEQUENCE)
    fields = _Reader(tbs)
    if fields.peek() == _VERSION:
        fields.one(_VERSION)
    serial = int.from_bytes(fields.one(_INTEGER), "big", signed=True)
    fields.one(_SEQUENCE)  # signature algorithm
    fields.one(_SEQUENCE)  # issuer
    validity = _Reader(fields.one(_SEQUENCE))
    not_before = _time(*validity.any())
    not_after = _time(*validity.any())
    fields.one(_SEQUENCE)  # subject
    fields.one(_SEQUENCE)  # subject public key info
    names: tuple[str, ...] = ()
    while not fields.done():
        tag, value = fields.any()
        if tag == _EXTENSIONS:
            names = _dns_names(_Reader(_Reader(value).one(_SEQUENCE)))
        elif tag not in (_ISSUER_UID, _SUBJECT_UID):
            raise ValueError(f"unexpected field (tag {tag:#x}) in the certificate")
    return Certificate(serial, not_before, not_after, names)


def _dns_names(extensions: "_Reader") -> tuple[str, ...]:
    while not extensions.done():
        extension = _Reader(extensions.one(_SEQUENCE))
        oid = extension.one(_OID)
        if extension.peek() == _BOOLEAN:
            extension.one(_BOOLEAN)  # critical
        value = extension.one(_OCTETS)
        if oid == _SAN:
            names = _Reader(_Reader(value).one(_SEQUENCE))
            found = []
            while not names.done():
                tag, name = names.any()
                if tag == _DNS_NAME:
                    found.append(name.decode("ascii"))
            return tuple(found)
    return ()


def _time(tag: int, value: bytes) -> datetime.datetime:
    text = value.decode("ascii")
    if tag == _UTC_TIME and len(text) == 13 and text.endswith("Z"):
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"  # RFC 5280 4.1.2.5.1
    elif not (tag == _GENERALIZED_TIME and len(text) == 15 and text.endswith("Z")):
        raise ValueError(f"unexpected time {text!r} (tag {tag:#x})")
    parsed = datetime.datetime.strptime(text, "%Y%m%d%H%M%SZ")
    return parsed.replace(tzinfo=datetime.UTC)


class _Reader:
    """DER type-length-value items, one after another."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def done(self) -> bool:
        return self.at >= len(self.data)

    def peek(self) -> int:
        if self.done():
            raise ValueError("truncated DER")
        return self.data[self.at]

    def one(self, tag: int) -> bytes:
        found, value = self.any()
        if found != tag:
            raise ValueError(f"expected DER tag {tag:#x}, found {found:#x}")
        return value

    def any(self) -> tuple[int, bytes]:
        tag = self.peek()
        if tag & 0x1F == 0x1F:
            raise ValueError("multi-byte DER tags are not used in certificates")
        at = self.at + 1
        if at >= len(self.data):
            raise ValueError("truncated DER")
        length = self.data[at]
        at += 1
        if length & 0x80:
            count = length & 0x7F
            if not 0 < count <= 4 or at + count > len(self.data):
                raise ValueError("bad DER length")
            length = int.from_bytes(self.data[at : at + count], "big")
            at += count
        if at + length > len(self.data):
            raise ValueError("truncated DER")
        self.at = at + length
        return tag, self.data[at : at + length]
