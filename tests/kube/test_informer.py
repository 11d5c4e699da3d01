"""The informer's cache on plain data: a recreated object is a delete plus an add; blindness."""

from typing import Any

from kube.informer import Informer


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
