"""Where the apiserver is and how to authenticate: a kubeconfig path, else in-cluster,
else $KUBECONFIG or ~/.kube/config.

Two forms of one answer. :func:`credentials` is what :mod:`kube.rest` (aiohttp)
speaks with; it reads the in-cluster service account and the usual kubeconfig
(server, CA, client certificate and key, token, as files or data) itself, without
importing the official client: its thousands of generated models are ~10 MiB of
a process that never uses them (the webhook: issue 8, bench/memory_bench.py). A
kubeconfig it does not read itself (an exec or auth-provider plugin, a
username and password, several files in $KUBECONFIG to merge) goes to the
official loader, which is then imported. :func:`api_client` builds the
official client for the code that calls it.
"""

import base64
import binascii
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

if TYPE_CHECKING:
    from kubernetes import client

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0
"""The in-cluster token, and a kubeconfig's ``tokenFile``, are re-read this often:
kubelet rotates the projected token (client-go re-reads both every minute too)."""
_OWN_USER_KEYS = frozenset(
    ("token", "tokenFile", "client-certificate", "client-certificate-data", "client-key",
     "client-key-data", "extensions")
)  # fmt: skip
"""What :func:`credentials` reads of a kubeconfig's user itself; any other key (exec,
auth-provider, username) sends the file to the official loader."""
_OWN_CLUSTER_KEYS = frozenset(
    ("server", "certificate-authority", "certificate-authority-data",
     "insecure-skip-tls-verify", "tls-server-name", "proxy-url", "extensions")
)  # fmt: skip


class KubeConfigError(RuntimeError):
    """No usable credentials; the message says where Headroom looked."""


class ClientConfiguration(Protocol):
    """What :func:`from_configuration` reads of the official client's Configuration."""

    host: str
    ssl_ca_cert: str | None
    cert_file: str | None
    key_file: str | None
    verify_ssl: bool

    def get_api_key_with_prefix(self, identifier: str, alias: str | None = None) -> str | None: ...


@dataclass(frozen=True)
class Credentials:
    """The apiserver's address and how to reach it; ``authorization()`` is asked before
    every request (a rotating token is re-read)."""

    server: str
    ca_file: str | None = None
    ca_data: str | None = None
    """PEM, from ``certificate-authority-data``."""
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = field(default=None, repr=False)
    key_data: bytes | None = field(default=None, repr=False)
    verify: bool = True
    tls_server_name: str | None = None
    proxy: str | None = None
    authorization: Callable[[], str | None] = field(default=lambda: None, repr=False)
    """The ``Authorization`` header's value, or None."""

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client's TLS settings (None for a plain-HTTP server)."""
        if not self.server.startswith("https"):
            return None
        context = ssl.create_default_context(cafile=self.ca_file or None, cadata=self.ca_data)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file or None)
        elif self.cert_data:
            _load_chain_data(context, self.cert_data, self.key_data)
        return context


def credentials(kubeconfig: str | None = None) -> Credentials:
    """Credentials from ``kubeconfig``, the in-cluster service account, or $KUBECONFIG.

    The same order, and the same meaning of each field, as :func:`api_client`.
    Raises :class:`KubeConfigError`.
    """
    where = kubeconfig or os.environ.get("KUBECONFIG") or "in-cluster / ~/.kube/config"
    try:
        if kubeconfig:
            found = _from_kubeconfig(Path(kubeconfig).expanduser())
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            found = _in_cluster(os.environ, SERVICE_ACCOUNT)
        else:
            paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
            if len(paths) > 1:
                found = from_configuration(_official(None))  # merged by the official rules
            else:
                default = Path(paths[0] if paths else "~/.kube/config").expanduser()
                found = _from_kubeconfig(default)
        _check_tls(found)
    except KubeConfigError as err:
        raise KubeConfigError(f"cannot load Kubernetes credentials from {where}: {err}") from err
    except (OSError, ValueError, yaml.YAMLError, ssl.SSLError) as err:
        raise KubeConfigError(
            f"cannot load Kubernetes credentials from {where}: {_one_line(err)}"
        ) from err
    return found


def _check_tls(found: Credentials) -> None:
    """Build the TLS context once, now: a CA or client certificate that cannot be used is
    named here, not at the first request (where a caller read it as a port it could not
    listen on)."""
    if not found.server.startswith("https"):
        return
    for label, path in (
        ("certificate-authority", found.ca_file),
        ("client-certificate", found.cert_file),
        ("client-key", found.key_file),
    ):
        if path and not os.path.isfile(path):
            raise KubeConfigError(f"{label} {path}: no such file")
    if found.ca_file or found.ca_data:
        which = (
            f"certificate-authority {found.ca_file}"
            if found.ca_file
            else "certificate-authority-data"
        )
        try:
            ssl.create_default_context(cafile=found.ca_file, cadata=found.ca_data)
        except (ssl.SSLError, ValueError) as err:
            raise KubeConfigError(f"{which}: not a usable CA certificate ({err})") from err
    try:
        found.ssl_context()
    except (ssl.SSLError, ValueError) as err:
        raise KubeConfigError(f"client certificate and key cannot be used ({err})") from err


def _one_line(err: BaseException) -> str:
    """An error as one line: a YAML error's problem and where, not its quoted excerpt."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {err.problem}"
    return " ".join(str(err).split())


def from_configuration(configuration: ClientConfiguration) -> Credentials:
    """The official client's Configuration (loaded by its own loader) as Credentials."""
    return Credentials(
        server=configuration.host.rstrip("/"),
        ca_file=configuration.ssl_ca_cert or None,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
        verify=bool(configuration.verify_ssl),
        tls_server_name=getattr(configuration, "tls_server_name", None) or None,
        proxy=getattr(configuration, "proxy", None) or None,
        authorization=lambda: configuration.get_api_key_with_prefix(
            "BearerToken", alias="authorization"
        ),
    )


def api_client(kubeconfig: str | None = None, *, pool: int | None = None) -> "client.ApiClient":
    """An ApiClient from ``kubeconfig``, the in-cluster service account, or $KUBECONFIG.

    ``pool``: connections kept to the apiserver (the client's default is 5 per
    CPU); a caller that sends many requests at once sizes it to match.
    """
    from kubernetes import client

    return client.ApiClient(_official(kubeconfig, pool=pool))


def _official(kubeconfig: str | None, *, pool: int | None = None) -> Any:
    """The official loader's Configuration (imports the official client)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if pool is not None:
        configuration.connection_pool_maxsize = pool
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError, TypeError, yaml.YAMLError) as err:
        # ValueError: not UTF-8, data not base64; TypeError: YAML that is not a mapping.
        where = kubeconfig or os.environ.get("KUBECONFIG") or "in-cluster / ~/.kube/config"
        why = f"not a kubeconfig ({err})" if isinstance(err, TypeError) else _one_line(err)
        raise KubeConfigError(f"cannot load Kubernetes credentials from {where}: {why}") from err
    return configuration


def _in_cluster(environ: Mapping[str, str], account: Path) -> Credentials:
    """As the official in-cluster loader: the Service's address, the mounted token and CA."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not both set")
    if ":" in host or "%" in host:
        host = f"[{host}]"
    ca = account / "ca.crt"
    token = _TokenFile(account / "token")
    token()  # fail now, not at the first request
    if not ca.is_file() or not ca.read_bytes():
        raise KubeConfigError(f"{ca} is missing or empty")
    return Credentials(server=f"https://{host}:{port}", ca_file=str(ca), authorization=token)


class _TokenFile:
    """``Bearer <the file's contents>``, re-read every :data:`TOKEN_REREAD_SECONDS`.

    Only the first read may fail: later, a file that cannot be read keeps the
    last token in use (kubelet swaps the file atomically; a request should
    fail on the apiserver's answer, not on a missing file).
    """

    def __init__(self, path: Path, initial: str = "") -> None:
        self.path = path
        self._value = f"Bearer {initial}" if initial else ""
        self._read_at = -TOKEN_REREAD_SECONDS

    def __call__(self) -> str:
        now = time.monotonic()
        if now - self._read_at >= TOKEN_REREAD_SECONDS:
            try:
                token = self.path.read_text().strip() if self.path.is_file() else ""
            except OSError:
                token = ""
            if token:
                self._value = f"Bearer {token}"
            elif not self._value:
                raise KubeConfigError(f"{self.path}: no token, or empty")
            else:
                log.warning("%s could not be re-read; the last token stays in use", self.path)
            self._read_at = now
        return self._value


def _from_kubeconfig(path: Path) -> Credentials:
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise KubeConfigError(f"{path}: not a kubeconfig")
    context = _named(document, "contexts", document.get("current-context"), "context")
    cluster = _named(document, "clusters", context.get("cluster"), "cluster")
    user = _named(document, "users", context.get("user"), "user") if context.get("user") else {}
    if set(user) - _OWN_USER_KEYS or set(cluster) - _OWN_CLUSTER_KEYS:
        return from_configuration(_official(str(path)))  # a plugin, basic auth: its loader
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeConfigError(f"{path}: the current context's cluster has no server")
    base = Path(os.path.abspath(path)).parent  # as the official loader: symlinks not followed
    token = str(user.get("token") or "")
    bearer = f"Bearer {token}" if token else None
    authorization: Callable[[], str | None] = lambda: bearer  # noqa: E731
    if user.get("tokenFile"):  # as client-go: re-read (a rotated token), ``token`` while unreadable
        authorization = _TokenFile(base / str(user["tokenFile"]), initial=token)
        authorization()  # fail now, not at the first request
    https = server.startswith("https")
    return Credentials(
        server=server.rstrip("/"),
        ca_file=_file(base, cluster.get("certificate-authority")) if https else None,
        ca_data=(_data(cluster, "certificate-authority-data").decode() or None) if https else None,
        cert_file=_file(base, user.get("client-certificate")) if https else None,
        key_file=_file(base, user.get("client-key")) if https else None,
        cert_data=(_data(user, "client-certificate-data") or None) if https else None,
        key_data=(_data(user, "client-key-data") or None) if https else None,
        verify=not cluster.get("insecure-skip-tls-verify", False),
        tls_server_name=cluster.get("tls-server-name") or None,
        proxy=cluster.get("proxy-url") or None,
        authorization=authorization,
    )


def _named(document: Mapping[str, Any], section: str, name: Any, key: str) -> dict[str, Any]:
    for entry in document.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key)
            return value if isinstance(value, dict) else {}
    raise KubeConfigError(f"no {section} entry named {name!r}")


def _file(base: Path, value: Any) -> str | None:
    return str(base / str(value)) if value else None


def _data(section: Mapping[str, Any], key: str) -> bytes:
    value = section.get(key)
    if not value:
        return b""
    try:
        return base64.b64decode(str(value), validate=True)
    except binascii.Error as err:
        raise KubeConfigError(f"{key}: not base64 ({err})") from err


def _load_chain_data(context: ssl.SSLContext, cert: bytes, key: bytes | None) -> None:
    """``load_cert_chain`` reads files only: the PEM goes through a private file that
    is gone once loaded (the official loader leaves its copies in /tmp)."""
    with tempfile.TemporaryDirectory(prefix="headroom-kube-") as directory:
        cert_path = Path(directory) / "client.crt"
        cert_path.write_bytes(cert)
        key_path = None
        if key:
            key_path = Path(directory) / "client.key"
            key_path.touch(mode=0o600)
            key_path.write_bytes(key)
        context.load_cert_chain(cert_path, key_path)
