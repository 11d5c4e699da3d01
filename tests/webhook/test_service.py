"""``headroom webhook`` wired end to end: kubeconfig -> watches (a stand-in
apiserver) -> readiness -> HTTPS admission with the policy from the watch."""

import asyncio
import contextlib
import json
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from certs.generate import generate
from cli.main import main
from tests.webhook.apiserver import StandInApiserver
from tests.webhook.reviews import decoded_patch, review_bytes
from webhook.service import Settings, serve


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "stand-in", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(json.dumps(config))
    return path


def test_a_missing_cert_dir_is_exit_code_2_naming_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert main(["webhook", "--cert-dir", str(tmp_path / "none"), "--port", "1"]) == 2
    assert "tls.crt" in caplog.text


@pytest.mark.parametrize("interval", ["0", "-5", "ten"])
def test_a_cert_check_interval_that_is_not_a_positive_duration_is_refused(
    tmp_path: Path, interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["webhook", "--cert-dir", str(tmp_path), "--cert-check-interval", interval]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "--cert-check-interval" in capsys.readouterr().err


async def test_the_service_becomes_ready_and_mutates_by_the_watched_policy(
    tmp_path: Path, apiserver: StandInApiserver
) -> None:
    generate(tmp_path / "certs", service="w", namespace="n", ips=["127.0.0.1"])
    port = free_port()
    server = str(apiserver.server.make_url("")).rstrip("/")
    settings = Settings(
        cert_dir=tmp_path / "certs",
        host="127.0.0.1",
        port=port,
        kubeconfig=str(kubeconfig(tmp_path / "kubeconfig", server)),
        shutdown_delay_seconds=0.0,
    )
    stopping = asyncio.Event()
    service = asyncio.create_task(serve(settings, stopping))
    context = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
    base = f"https://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            async with asyncio.timeout(15):
                ready = 0
                while ready != 200:
                    with contextlib.suppress(aiohttp.ClientConnectionError):
                        async with session.get(f"{base}/readyz") as reply:
                            ready = reply.status
                    await asyncio.sleep(0.05)
            async with session.post(
                f"{base}/mutate", data=review_bytes("deployment-pod-shared")
            ) as reply:
                response = (await reply.json())["response"]
            async with session.get(f"{base}/metrics") as reply:
                metrics = await reply.text()
    finally:
        stopping.set()
        await service
    assert response["allowed"] is True
    assert apiserver.authorizations == {"Bearer t"}  # the kubeconfig's token, on every request
    paths = {op["path"] for op in decoded_patch(response)}
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu.shared" in paths
    assert 'headroom_webhook_admissions_total{outcome="mutated",policy="shared-default"}' in metrics
    assert "headroom_webhook_certificate_expiry_timestamp_seconds" in metrics
    assert "headroom_webhook_invalid_policies 0.0" in metrics


def test_the_webhook_imports_neither_the_official_client_nor_cryptography() -> None:
    # Issue 8: their imports were ~10 and ~8 MiB of a 256Mi webhook that used neither
    # (kube.config and kube.rest speak to the apiserver; webhook.certificate reads the
    # serving certificate's few fields).
    code = (
        "import sys, cli.main, webhook.service;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes', 'cryptography'}))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"
