"""The informer's cache on plain data: a recreated object is a delete plus an add; blindness."""

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from extender.state import ClusterState
from kube.informer import Informer, identity
from tests.extender.objects import gpu_node, gpu_pod, uid_of


def pod(name: str, uid: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version}}


def recording() -> tuple[Informer, list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        events.append((kind, obj["metadata"]["uid"]))

    return Informer(lambda **_: None, name="pods", handler=handler), events


def test_a_relist_that_finds_a_recreated_pod_deletes_the_old_uid() -> None:
    # Issue 7: a StatefulSet's pod recreated under the same name kept the old UID's charge.
    informer, events = recording()
    informer._replace({"ns/web-0": pod("web-0", "old")})
    informer._replace({"ns/web-0": pod("web-0", "new")})
    assert events == [("ADDED", "old"), ("DELETED", "old"), ("ADDED", "new")]
    informer._replace({"ns/web-0": pod("web-0", "new", "2")})
    assert events[-1] == ("MODIFIED", "new")


def test_a_watch_event_for_a_new_uid_under_an_old_name_deletes_the_old_one() -> None:
    informer, events = recording()
    informer._apply("ADDED", pod("web-0", "old"))
    informer._apply("MODIFIED", pod("web-0", "new"))
    assert events == [("ADDED", "old"), ("DELETED", "old"), ("ADDED", "new")]
    assert informer.items["ns/web-0"]["metadata"]["uid"] == "new"


def test_blind_since_the_first_failure_until_a_good_list() -> None:
    informer, _ = recording()
    assert informer.blind_for(now=100.0) == 0.0
    informer.failing_since = 90.0
    assert informer.blind_for(now=100.0) == 10.0


def test_an_identity_informer_keeps_stubs_and_a_relist_still_frees_a_gone_gpu_pod() -> None:
    # Issue 8: whole pods in the informer's store were ~27 KiB of heap each. The
    # extender keeps only identities there; a pod a re-list no longer shows must
    # still be dropped from its accounting by the DELETED replayed from the stub.
    state = ClusterState(margin=0, stale_after=90.0)
    state.on_node("ADDED", gpu_node("gpu-a"))
    informer = Informer(lambda **_: None, name="pods", handler=state.on_pod, keep=identity)
    bound = gpu_pod("p", node="gpu-a", declared="10Gi", phase="Running")
    bound["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    informer._replace({"research/p": bound})
    assert informer.items["research/p"] == {
        "metadata": {"name": "p", "namespace": "research", "uid": uid_of(bound)}
    }
    assert uid_of(bound) in state.pods
    informer._replace({})
    assert state.pods == {}
    account = state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].declared == 0


async def test_a_relist_reads_pages_and_deletes_only_what_no_page_showed() -> None:
    pages = {
        None: {"metadata": {"continue": "p2"}, "items": [pod("a", "ua"), pod("b", "ub")]},
        "p2": {"metadata": {"resourceVersion": "42"}, "items": [pod("c", "uc")]},
    }
    asked: list[dict[str, Any]] = []

    def list_func(**kwargs: Any) -> Any:
        asked.append(kwargs)
        return SimpleNamespace(data=json.dumps(pages[kwargs.get("_continue")]).encode())

    events: list[tuple[str, str]] = []
    informer = Informer(
        list_func, name="pods", handler=lambda k, o: events.append((k, o["metadata"]["uid"]))
    )
    informer._loop = asyncio.get_running_loop()
    informer._apply("ADDED", pod("gone", "ugone"))
    version = await asyncio.to_thread(informer._relist)
    await asyncio.sleep(0.01)  # the pages and the end of the list, posted to this loop
    assert version == "42"
    assert [a.get("_continue") for a in asked] == [None, "p2"]
    assert all(a["limit"] == 500 for a in asked)
    assert events[1:] == [("ADDED", "ua"), ("ADDED", "ub"), ("ADDED", "uc"), ("DELETED", "ugone")]
    assert sorted(informer.items) == ["ns/a", "ns/b", "ns/c"]
    assert informer.synced.is_set()
