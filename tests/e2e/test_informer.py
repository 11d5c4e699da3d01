"""kube.informer against the real apiserver: list, watch, resumed windows, failed watches,
each over kube.rest (the webhook's and the extender's) and over the official client's
list functions (the agent's); and kube.config's in-cluster credentials.

A real ``410 Gone`` needs etcd to have compacted past the watched version,
which a young cluster has not done (it replays from any old version instead),
so the failure path is driven by a version the apiserver refuses outright; a
410 takes the same path (log, back off, re-list).
"""

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client

from devcluster.cluster import Cluster
from devcluster.components import NAMESPACE, SERVICE_ACCOUNTS
from kube import config, informer
from kube.config import api_client, credentials
from kube.informer import Informer, Resource
from kube.rest import Rest
from tests.e2e.conftest import NamespaceFactory

pytestmark = pytest.mark.e2e


@pytest.fixture
def core(cluster: Cluster) -> Iterator[client.CoreV1Api]:
    api = api_client(str(cluster.kubeconfig))
    yield client.CoreV1Api(api)
    api.close()


@pytest.fixture
def ns(namespace: NamespaceFactory) -> str:
    return namespace()


@pytest.fixture(params=["rest", "client"])
async def configmaps(
    request: pytest.FixtureRequest, cluster: Cluster, core: client.CoreV1Api, ns: str
) -> AsyncIterator[Any]:
    """What an Informer lists and watches: a kube.informer.Resource, or a client's list function."""
    if request.param == "client":
        yield functools.partial(core.list_namespaced_config_map, ns)
        return
    rest = Rest(credentials(str(cluster.kubeconfig)), timeout=10.0)
    yield Resource(rest, f"/api/v1/namespaces/{ns}/configmaps")
    await asyncio.sleep(0)  # let a stopped informer's task end before its client closes
    await rest.close()


async def until(what: str, condition: Callable[[], bool], within: float = 20.0) -> None:
    for _ in range(int(within / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {within}s: {what}")


def configmap(name: str, value: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"v": value})


async def test_lists_then_follows_adds_changes_and_deletes(
    core: client.CoreV1Api, ns: str, configmaps: Any
) -> None:
    core.create_namespaced_config_map(ns, configmap("before", "1"))
    seen: list[tuple[str, str]] = []
    cache = Informer(
        configmaps,
        name="configmaps",
        handler=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
    )
    cache.start()
    try:
        await asyncio.wait_for(cache.synced.wait(), 20)
        assert f"{ns}/before" in cache.items

        await asyncio.to_thread(core.create_namespaced_config_map, ns, configmap("a", "1"))
        await until("a added", lambda: f"{ns}/a" in cache.items)
        await asyncio.to_thread(core.patch_namespaced_config_map, "a", ns, {"data": {"v": "2"}})
        await until("a changed", lambda: cache.items[f"{ns}/a"]["data"]["v"] == "2")
        await asyncio.to_thread(core.delete_namespaced_config_map, "a", ns)
        await until("a deleted", lambda: f"{ns}/a" not in cache.items)
    finally:
        cache.stop()
    assert ("DELETED", "a") in seen
    assert cache.relists == 1


async def test_a_closed_watch_window_resumes_without_a_relist(
    core: client.CoreV1Api, ns: str, configmaps: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer, "WATCH_WINDOW_SECONDS", 1)
    cache = Informer(configmaps, name="cm")
    cache.start()
    try:
        await asyncio.wait_for(cache.synced.wait(), 20)
        await until("two windows closed by the server", lambda: cache.windows >= 2, within=15)
        await asyncio.to_thread(core.create_namespaced_config_map, ns, configmap("b", "1"))
        await until("b seen after the resumed windows", lambda: f"{ns}/b" in cache.items)
    finally:
        cache.stop()
    assert cache.relists == 1


async def test_a_refused_watch_relists_and_carries_on(
    core: client.CoreV1Api, ns: str, configmaps: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer, "BACKOFF_MAX_SECONDS", 0.2)
    cache = Informer(configmaps, name="cm")
    real_relist = cache._relist
    versions = iter(["not-a-version"])  # the first watch is refused by the apiserver

    async def relist_then_expire() -> str:
        await real_relist()
        return next(versions, None) or await real_relist()

    monkeypatch.setattr(cache, "_relist", relist_then_expire)
    cache.start()
    try:
        await asyncio.wait_for(cache.synced.wait(), 20)
        await until("re-listed after the refused watch", lambda: cache.relists >= 3)
        await asyncio.to_thread(core.create_namespaced_config_map, ns, configmap("c", "1"))
        await until("c seen after the re-list", lambda: f"{ns}/c" in cache.items)
    finally:
        cache.stop()


async def test_in_cluster_credentials_reach_the_apiserver_as_the_service_account(
    cluster: Cluster, tmp_path: Path
) -> None:
    # What a pod sees: KUBERNETES_SERVICE_HOST/PORT, its ServiceAccount's token and
    # the cluster CA, mounted as files (the webhook's and the extender's path).
    account = SERVICE_ACCOUNTS["webhook"]
    token = cluster.kubectl("create", "token", account, "-n", NAMESPACE).stdout.strip()
    (tmp_path / "token").write_text(token)
    (tmp_path / "ca.crt").write_bytes((cluster.state.pki / "ca.crt").read_bytes())
    server = urlsplit(cluster.state.server)
    environ = {"KUBERNETES_SERVICE_HOST": str(server.hostname),
               "KUBERNETES_SERVICE_PORT": str(server.port)}  # fmt: skip
    rest = Rest(config._in_cluster(environ, tmp_path), timeout=10.0)
    try:
        namespace = await rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}")
        secrets = await rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets")
    finally:
        await rest.close()
    assert namespace.status == 200, namespace.message()
    # Refused as the ServiceAccount, so that is who the token made us.
    assert secrets.status == 403, secrets.message()
    assert f"system:serviceaccount:{NAMESPACE}:{account}" in secrets.message()
