"""The cluster cache: fed through its informer callbacks, and wired to a
stand-in apiserver to prove it lists and watches the right URLs."""

import asyncio
import json

import pytest

from kube.config import Credentials
from kube.rest import Rest
from tests.webhook.apiserver import POLICY, StandInApiserver, mig_node, namespace
from webhook.cache import ClusterCache


def test_namespace_labels_follow_events() -> None:
    cache = ClusterCache()
    assert cache.namespace_labels("ml") is None
    cache.on_namespace("ADDED", namespace("ml", **{"headroom.dev/policy": "a"}))
    assert cache.namespace_labels("ml") == {"headroom.dev/policy": "a"}
    cache.on_namespace("MODIFIED", namespace("ml", **{"headroom.dev/policy": "b", "odd": 5}))
    assert cache.namespace_labels("ml") == {"headroom.dev/policy": "b"}
    cache.on_namespace("DELETED", namespace("ml"))
    assert cache.namespace_labels("ml") is None


def test_a_valid_policy_is_parsed_once_and_kept() -> None:
    cache = ClusterCache()
    cache.on_policy("ADDED", POLICY)
    policy = cache.policies["shared-default"]
    assert policy.spec.mode == "shared"
    assert cache.invalid_policies == {}


def test_a_policy_turning_invalid_is_dropped_and_reported() -> None:
    cache = ClusterCache()
    cache.on_policy("ADDED", POLICY)
    broken = json.loads(json.dumps(POLICY))
    broken["spec"]["placement"] = "everywhere"
    cache.on_policy("MODIFIED", broken)
    assert "shared-default" not in cache.policies  # never the older version
    assert "spec.placement" in cache.invalid_policies["shared-default"]
    cache.on_policy("MODIFIED", POLICY)
    assert "shared-default" in cache.policies
    assert cache.invalid_policies == {}
    cache.on_policy("DELETED", POLICY)
    assert cache.policies == {}


def test_the_mig_offer_comes_from_nodes_and_is_recomputed_only_on_change() -> None:
    cache = ClusterCache()
    assert cache.mig_offer() is not None
    cache.on_node("ADDED", mig_node("a100-1"))
    cache.on_node("ADDED", mig_node("a100-2", count="4"))
    offer = cache.mig_offer()
    assert offer is not None
    assert offer.profiles["1g.10gb"].instances == 11
    assert offer.profiles["1g.10gb"].memory_mib == 9856
    # A change that does not touch MIG (a new unrelated label) keeps the offer.
    cache.on_node("MODIFIED", mig_node("a100-1", team="vision"))
    assert cache.mig_offer() is offer
    cache.on_node("DELETED", mig_node("a100-2"))
    changed = cache.mig_offer()
    assert changed is not offer
    assert changed is not None
    assert changed.profiles["1g.10gb"].instances == 7


def test_without_the_node_watch_there_is_no_offer() -> None:
    cache = ClusterCache(watch_nodes=False)
    cache.on_node("ADDED", mig_node("a100-1"))
    assert cache.mig_offer() is None


async def test_an_unknown_namespace_without_a_client_is_a_lookup_error() -> None:
    with pytest.raises(LookupError, match="brand-new"):
        await ClusterCache().labels_for("brand-new")


async def test_the_cache_lists_and_watches_the_right_resources(
    apiserver: StandInApiserver,
) -> None:
    server = str(apiserver.server.make_url("")).rstrip("/")
    rest = Rest(Credentials(server=server, authorization=lambda: "Bearer t"), timeout=5.0)
    cache = ClusterCache()
    try:
        cache.start(rest)
        assert set(cache.not_synced()) <= {"namespaces", "gpusharingpolicies", "nodes"}
        async with asyncio.timeout(10):
            await cache.wait_synced()
            await apiserver.watched.wait()
            await asyncio.sleep(0.05)  # the watched event is handled
        assert cache.not_synced() == []
        assert cache.namespace_labels("ml-team") == {"headroom.dev/policy": "shared-default"}
        assert cache.namespace_labels("late") == {"headroom.dev/policy": "x"}
        assert cache.policies["shared-default"].spec.default_memory == "4Gi"
        offer = cache.mig_offer()
        assert offer is not None
        assert "1g.10gb" in offer.profiles
        # A namespace newer than the watch is read once, directly.
        assert await cache.labels_for("newest") == {"headroom.dev/policy": "fresh"}
    finally:
        cache.stop()
        await rest.close()
    paths = apiserver.requests
    # Lists come in pages (kube.informer.FIRST_PAGE, then sized by what a page weighed).
    assert "/api/v1/namespaces?limit=100" in paths
    assert "/apis/headroom.dev/v1alpha1/gpusharingpolicies?limit=100" in paths
    assert "/api/v1/nodes?labelSelector=nvidia.com/mig.capable%3Dtrue&limit=100" in paths
    assert any(p.startswith("/api/v1/namespaces?") and "watch=" in p for p in paths)
    assert "/api/v1/namespaces/newest" in paths
    assert apiserver.authorizations == {"Bearer t"}
