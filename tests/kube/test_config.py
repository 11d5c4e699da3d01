"""kube.config.credentials: the kubeconfig shapes it reads itself, the in-cluster service
account, the official loader for the rest, and TLS to a real HTTPS server on 127.0.0.1."""

import base64
import json
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from certs.generate import generate
from kube import config
from kube.config import Credentials, KubeConfigError, credentials, from_configuration
from kube.rest import Rest, Unreachable


def kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "other", "cluster": {"server": "https://wrong"}},
                     {"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }  # fmt: skip
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    generate(directory, service="apiserver", namespace="default", ips=["127.0.0.1"])
    return directory


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_files_relative_to_the_kubeconfig_and_a_token_file(tmp_path: Path, pki: Path) -> None:
    (tmp_path / "token").write_text("file-token\n")
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / name).write_bytes((pki / name).read_bytes())
    path = kubeconfig(
        tmp_path / "config",
        {"server": "https://10.0.0.1:6443/", "certificate-authority": "ca.crt"},
        {"client-certificate": "tls.crt", "client-key": "tls.key", "tokenFile": "token"},
    )
    found = credentials(str(path))
    assert found.server == "https://10.0.0.1:6443"
    assert found.ca_file == str(tmp_path / "ca.crt")
    assert found.cert_file == str(tmp_path / "tls.crt")
    assert found.key_file == str(tmp_path / "tls.key")
    assert found.authorization() == "Bearer file-token"
    assert found.ssl_context() is not None  # the chain and the CA load


def test_data_fields_load_and_leave_no_file_behind(tmp_path: Path, pki: Path) -> None:
    path = kubeconfig(
        tmp_path / "config",
        {"server": "https://h:6443", "certificate-authority-data": b64(pki / "ca.crt")},
        {"client-certificate-data": b64(pki / "tls.crt"), "client-key-data": b64(pki / "tls.key"),
         "token": "t"},
    )  # fmt: skip
    found = credentials(str(path))
    assert found.ca_data == (pki / "ca.crt").read_text()
    assert found.authorization() == "Bearer t"
    before = set(Path("/tmp").glob("headroom-kube-*"))
    context = found.ssl_context()
    assert context is not None
    assert [c["subject"] for c in context.get_ca_certs()]  # the CA from the data
    assert set(Path("/tmp").glob("headroom-kube-*")) == before


def test_plain_http_and_insecure(tmp_path: Path) -> None:
    plain = credentials(str(kubeconfig(tmp_path / "a", {"server": "http://127.0.0.1:8080"}, {})))
    assert plain.ssl_context() is None
    assert plain.authorization() is None
    insecure = kubeconfig(
        tmp_path / "b", {"server": "https://h", "insecure-skip-tls-verify": True}, {}
    )
    assert credentials(str(insecure)).verify is False


def test_a_plugin_goes_to_the_official_loader(tmp_path: Path) -> None:
    # An exec plugin (here a Python one-liner printing an ExecCredential) is not read here.
    status = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-exec"},
    }
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": ["-c", f"print({json.dumps(json.dumps(status))})"],
        "interactiveMode": "Never",
    }
    path = kubeconfig(tmp_path / "config", {"server": "http://127.0.0.1:1"}, {"exec": plugin})
    found = credentials(str(path))
    assert found.server == "http://127.0.0.1:1"
    assert found.authorization() == "Bearer from-exec"


def test_the_same_answer_as_the_official_loader(tmp_path: Path, pki: Path) -> None:
    path = kubeconfig(
        tmp_path / "config",
        {"server": "https://h:6443", "certificate-authority": str(pki / "ca.crt")},
        {"token": "t", "client-certificate": str(pki / "tls.crt"),
         "client-key": str(pki / "tls.key")},
    )  # fmt: skip
    ours = credentials(str(path))
    official = from_configuration(config._official(str(path)))
    fields = ("server", "ca_file", "cert_file", "key_file", "verify")
    assert [getattr(ours, f) for f in fields] == [getattr(official, f) for f in fields]
    assert ours.authorization() == official.authorization()


def test_in_cluster_reads_the_service_account_and_rereads_the_token(
    tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("one")
    (tmp_path / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    found = config._in_cluster(environ, tmp_path)
    assert found.server == "https://[fd00::1]:443"
    assert found.ca_file == str(tmp_path / "ca.crt")
    assert found.authorization() == "Bearer one"
    (tmp_path / "token").write_text("two")  # kubelet rotated it
    assert found.authorization() == "Bearer one"  # not yet re-read
    monkeypatch.setattr(config, "TOKEN_REREAD_SECONDS", 0.0)
    assert found.authorization() == "Bearer two"
    (tmp_path / "token").unlink()  # mid-swap: the last token stays in use
    assert found.authorization() == "Bearer two"


def test_a_kubeconfig_token_file_is_reread_as_client_go_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """client-go reads ``tokenFile`` through a cached file token source (a rotated token
    is used within a minute); ``token`` beside it is used while the file cannot be read."""
    (tmp_path / "token").write_text("one\n")
    path = kubeconfig(tmp_path / "config", {"server": "http://127.0.0.1:1"}, {"tokenFile": "token"})
    found = credentials(str(path))
    assert found.authorization() == "Bearer one"
    (tmp_path / "token").write_text("two\n")  # rotated by whoever mounts it
    monkeypatch.setattr(config, "TOKEN_REREAD_SECONDS", 0.0)
    assert found.authorization() == "Bearer two"
    (tmp_path / "token").unlink()
    user = {"token": "inline", "tokenFile": "token"}
    assert credentials(str(kubeconfig(path, {"server": "http://h"}, user))).authorization() == (
        "Bearer inline"
    )
    with pytest.raises(KubeConfigError, match="token"):
        credentials(str(kubeconfig(path, {"server": "http://h"}, {"tokenFile": "token"})))


def test_what_is_missing_is_named(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="nowhere"):
        credentials(str(tmp_path / "nowhere"))
    environ = {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}
    with pytest.raises(KubeConfigError, match="token"):
        config._in_cluster(environ, tmp_path)
    lost = kubeconfig(tmp_path / "config", {"server": "https://h"}, {})
    lost.write_text(lost.read_text().replace("current-context: x", "current-context: gone"))
    with pytest.raises(KubeConfigError, match="gone"):
        credentials(str(lost))


@pytest.fixture
async def https(pki: Path) -> AsyncIterator[str]:
    """A real HTTPS server on 127.0.0.1, its certificate issued by ``pki``'s CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki / "tls.crt", pki / "tls.key")

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"authorization": request.headers.get("Authorization")})

    app = web.Application()
    app.router.add_get("/hello", hello)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=context)
    yield f"https://127.0.0.1:{server.port}"
    await server.close()


async def test_rest_verifies_the_server_by_the_ca_data(
    https: str, pki: Path, tmp_path: Path
) -> None:
    trusted = Credentials(
        server=https, ca_data=(pki / "ca.crt").read_text(), authorization=lambda: "Bearer t"
    )
    rest = Rest(trusted, timeout=5.0)
    try:
        answer = await rest.request("GET", "/hello")
    finally:
        await rest.close()
    assert answer.json() == {"authorization": "Bearer t"}

    other = tmp_path / "other"
    generate(other, service="other", namespace="default")
    stranger = Rest(Credentials(server=https, ca_data=(other / "ca.crt").read_text()), timeout=5.0)
    try:
        with pytest.raises(Unreachable, match=r"[Cc]ertificate"):
            await stranger.request("GET", "/hello")
    finally:
        await stranger.close()


@pytest.mark.parametrize(
    "text",
    [b"garbage: [\n", b"[1, 2]\n", b"just a string\n", b"\xff\xfe"],
    ids=["yaml", "list", "string", "binary"],
)
def test_a_malformed_kubeconfig_is_named_by_both_loaders(tmp_path: Path, text: bytes) -> None:
    """``headroom top``, ``certs`` and ``demo`` use the official loader (api_client): a
    malformed file once reached the user as a yaml.ParserError or TypeError traceback."""
    path = tmp_path / "config"
    path.write_bytes(text)
    for load in (config.api_client, credentials):
        with pytest.raises(KubeConfigError) as caught:
            load(str(path))
        message = str(caught.value)
        assert str(path) in message, (load, message)
        assert "\n" not in message, (load, message)


def test_a_kubeconfig_whose_data_is_not_base64_is_named_by_the_official_loader(
    tmp_path: Path,
) -> None:
    path = kubeconfig(
        tmp_path / "config",
        {"server": "https://h:1", "certificate-authority-data": "!!notbase64"},
        {"token": "t"},
    )
    with pytest.raises(KubeConfigError, match="config"):
        config.api_client(str(path))


@pytest.mark.parametrize(
    ("cluster", "user", "named"),
    [
        ({"certificate-authority": "gone/ca.crt"}, {"token": "t"}, "gone/ca.crt"),
        ({"certificate-authority-data": "aGVsbG8="}, {"token": "t"}, "certificate-authority-data"),
        ({}, {"client-certificate": "gone.crt", "client-key": "gone.key"}, "gone.crt"),
    ],
    ids=["ca-file", "ca-data", "client-cert"],
)
def test_tls_material_that_cannot_be_used_is_named_at_load(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], named: str
) -> None:
    """Before, ``credentials`` accepted these and the first TLS handshake failed: the
    webhook said ``cannot listen on 0.0.0.0:8443: [Errno 2] No such file or directory``
    and the extender ``cannot serve on 127.0.0.1:8888``, blaming the port."""
    path = kubeconfig(tmp_path / "config", {"server": "https://h:1", **cluster}, user)
    with pytest.raises(KubeConfigError) as caught:
        credentials(str(path))
    message = str(caught.value)
    assert str(path) in message
    assert named in message
    assert "\n" not in message
