"""The running webhook reports a certificate that must not serve on /readyz."""

import asyncio
import contextlib
import ssl
from pathlib import Path

import aiohttp

from certs.generate import generate
from tests.webhook.apiserver import StandInApiserver
from tests.webhook.test_service import free_port, kubeconfig
from webhook.service import Settings, serve


async def test_a_certificate_for_another_service_keeps_the_webhook_not_ready(
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
        expected_dns=("headroom-webhook.headroom-system.svc",),
    )
    stopping = asyncio.Event()
    service = asyncio.create_task(serve(settings, stopping))
    context = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
    text, status = "", 0
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            async with asyncio.timeout(15):
                # Once the caches have synced only the certificate is left.
                while not text.startswith("waiting for: a valid certificate"):
                    with contextlib.suppress(aiohttp.ClientConnectionError):
                        async with session.get(f"https://127.0.0.1:{port}/readyz") as reply:
                            text, status = await reply.text(), reply.status
                    await asyncio.sleep(0.05)
    finally:
        stopping.set()
        await service
    assert status == 503
    assert "does not name headroom-webhook.headroom-system.svc" in text
