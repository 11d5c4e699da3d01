"""/filter, /prioritize, /bind and the service endpoints, through HTTP, with wire JSON
shaped as kube-scheduler v1.34 sends it (tests/data/extender)."""

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from headroom import names
from tests.extender.conftest import Harness
from tests.extender.objects import GIB, gpu_node, gpu_pod, gpu_report, uid_of

DATA = Path(__file__).parent.parent / "data" / "extender"
FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text())
    return loaded


def seed_cluster(h: Harness) -> None:
    """gpu-a: simulation, inference and a leaking notebook (16 GiB seen); gpu-b: idle."""
    for name in ("gpu-a", "gpu-b"):
        h.state.on_node("ADDED", gpu_node(name))
    bound = [
        gpu_pod("simulation", node="gpu-a", declared="10Gi", phase="Running"),
        gpu_pod("inference", node="gpu-a", declared="10Gi", phase="Running"),
        gpu_pod("old-notebook", node="gpu-a", declared="6Gi", phase="Running"),
    ]
    for pod in bound:
        h.state.on_pod("ADDED", pod)
    used = dict(zip(map(uid_of, bound), (9 * GIB, 2 * GIB, 16 * GIB), strict=True))
    h.state.on_report("ADDED", gpu_report("gpu-a", {0: used}))
    h.state.on_report("ADDED", gpu_report("gpu-b", {0: {}}))


async def post(h: Harness, verb: str, body: object) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    # aiohttp's client warns about large raw bodies; a stream is what it wants.
    response = await h.client.post(
        f"/{verb}", data=io.BytesIO(data), headers={"Content-Type": "application/json"}
    )
    return response.status, await response.json(content_type=None)


async def test_filter_node_names_mode(harness: Harness) -> None:
    seed_cluster(harness)
    status, result = await post(harness, "filter", fixture("filter-node-names.json"))
    assert status == 200
    assert set(result) == FILTER_KEYS
    assert result["Nodes"] is None
    assert result["NodeNames"] == ["gpu-b"]
    assert result["FailedNodes"]["gpu-a"] == (
        "gpu 0 NVIDIA-A100-PCIE-40GB: 3.5 GiB headroom < 6.0 GiB declared"
    )
    assert "not in the extender's cache" in result["FailedNodes"]["gpu-c"]
    assert result["FailedAndUnresolvableNodes"] == {}
    assert result["Error"] == ""


async def test_filter_node_list_mode_echoes_the_nodes_it_keeps(harness: Harness) -> None:
    seed_cluster(harness)
    args = fixture("filter-node-list.json")
    status, result = await post(harness, "filter", args)
    assert status == 200
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-b"]
    assert result["Nodes"]["items"][0] == args["Nodes"]["items"][1]  # as received
    assert result["Nodes"]["metadata"] == {}
    assert result["NodeNames"] == ["gpu-b"]
    assert set(result["FailedNodes"]) == {"gpu-a", "gpu-c"}


@pytest.mark.parametrize(
    "limits",
    [{"cpu": "1"}, {names.GPU_SHARED: "0"}, {names.GPU_SHARED: "0", "nvidia.com/mig-1g.5gb": "0"}],
    ids=["no-gpu", "zero-shared", "zero-shared-and-mig"],
)
async def test_filter_refuses_a_pod_without_shared_or_mig_resource_everywhere(
    harness: Harness, limits: dict[str, str]
) -> None:
    # kube-scheduler sends a pod naming a managed resource even at a count of 0, and
    # this extender is then its binder; the bind would refuse it on every retry.
    args = fixture("filter-node-names.json")
    args["Pod"]["spec"]["containers"][0]["resources"] = {"limits": limits}
    harness.ready[0] = False  # not even readiness matters for such a pod
    status, result = await post(harness, "filter", args)
    assert (status, result["NodeNames"], result["FailedNodes"]) == (200, [], {})
    reason = "the headroom extender binds only pods asking for a shared GPU or MIG slice"
    assert result["FailedAndUnresolvableNodes"] == dict.fromkeys(args["NodeNames"], reason)
    assert result["Error"] == ""


async def test_filter_before_caches_sync_is_an_error(harness: Harness) -> None:
    harness.ready[0] = False
    status, result = await post(harness, "filter", fixture("filter-node-names.json"))
    assert status == 200
    assert "not synced" in result["Error"]
    assert result["NodeNames"] == []


async def test_filter_bad_declaration_is_unresolvable_everywhere(harness: Harness) -> None:
    seed_cluster(harness)
    args = fixture("filter-node-names.json")
    args["Pod"]["metadata"]["annotations"][names.ANNOTATION_PLACEMENT] = "diagonal"
    _, result = await post(harness, "filter", args)
    assert result["NodeNames"] == []
    assert set(result["FailedAndUnresolvableNodes"]) == {"gpu-a", "gpu-b", "gpu-c"}
    assert '"diagonal"' in result["FailedAndUnresolvableNodes"]["gpu-b"]


async def test_filter_falls_back_to_declarations_without_a_report_and_says_so(
    harness: Harness,
) -> None:
    seed_cluster(harness)
    harness.state.last_good.clear()  # an agent that never reported
    harness.state.on_report("DELETED", gpu_report("gpu-a", {}))
    _, result = await post(harness, "filter", fixture("filter-node-names.json"))
    # Declarations alone (26 GiB of 40) leave room: the leak is invisible without the agent.
    assert result["NodeNames"] == ["gpu-a", "gpu-b"]
    pod = fixture("filter-node-names.json")
    for section in ("limits", "requests"):
        pod["Pod"]["spec"]["containers"][0]["resources"][section][names.GPU_MEMORY] = "16Gi"
    _, result = await post(harness, "filter", pod)
    assert result["FailedNodes"]["gpu-a"] == (
        "gpu 0 NVIDIA-A100-PCIE-40GB: 13.5 GiB headroom < 16.0 GiB declared "
        "(no GPUNodeReport from the node agent: declarations and labels only)"
    )


async def test_a_deleted_report_leaves_what_it_observed_counting(harness: Harness) -> None:
    seed_cluster(harness)
    _, before = await post(harness, "filter", fixture("filter-node-names.json"))
    harness.state.on_report("DELETED", gpu_report("gpu-a", {}))
    _, after = await post(harness, "filter", fixture("filter-node-names.json"))
    assert before["NodeNames"] == after["NodeNames"] == ["gpu-b"]
    assert "no GPUNodeReport" in after["FailedNodes"]["gpu-a"]


async def test_prioritize_binpack_and_spread(harness: Harness) -> None:
    for name, used in (("empty", 0), ("half", 20), ("most", 28)):
        harness.state.on_node("ADDED", gpu_node(name))
        if used:
            harness.state.on_pod("ADDED", gpu_pod(f"p-{name}", node=name, declared=f"{used}Gi"))
    args = {
        "Pod": gpu_pod("new", declared="8Gi"),
        "Nodes": None,
        "NodeNames": ["empty", "half", "most"],
    }
    status, scores = await post(harness, "prioritize", args)
    assert status == 200
    assert [s["Host"] for s in scores] == ["empty", "half", "most"]
    binpack = {s["Host"]: s["Score"] for s in scores}
    assert binpack["most"] > binpack["half"] > binpack["empty"]
    args["Pod"] = gpu_pod("new", declared="8Gi", placement="spread")
    _, scores = await post(harness, "prioritize", args)
    spread = {s["Host"]: s["Score"] for s in scores}
    assert spread["empty"] > spread["half"] > spread["most"]
    assert all(set(s) == {"Host", "Score"} and 0 <= s["Score"] <= 10 for s in scores)


async def test_bind_creates_the_binding_and_holds_the_pod(harness: Harness) -> None:
    seed_cluster(harness)
    pod = fixture("filter-node-names.json")["Pod"]
    harness.state.on_pod("ADDED", pod)
    status, result = await post(harness, "bind", fixture("bind.json"))
    assert (status, result) == (200, {"Error": ""})
    assert harness.binder.calls == [
        ("seed001", "notebook-7c9d8b6f5-x2x4q", "5f0c3b1e-8a0e-4d55-9a7e-2b8f1f6c9d41", "gpu-b")
    ]
    assert uid_of(pod) in harness.state.assumed
    # The watch then shows it bound: the assumption is replaced by the cache.
    harness.state.on_pod("MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": "gpu-b"}})
    assert harness.state.assumed == {}
    assert sum(1 for _ in harness.state.claims_on("gpu-b")) == 1


async def test_bind_refuses_to_overcommit(harness: Harness) -> None:
    seed_cluster(harness)
    harness.state.on_pod("ADDED", fixture("filter-node-names.json")["Pod"])
    args = {**fixture("bind.json"), "Node": "gpu-a"}
    status, result = await post(harness, "bind", args)
    assert status == 200
    assert result["Error"] == (
        "not binding seed001/notebook-7c9d8b6f5-x2x4q to gpu-a: "
        "gpu 0 NVIDIA-A100-PCIE-40GB: 3.5 GiB headroom < 6.0 GiB declared"
    )
    assert harness.binder.calls == []


async def test_bind_failure_releases_the_assumption(harness: Harness) -> None:
    seed_cluster(harness)
    harness.state.on_pod("ADDED", fixture("filter-node-names.json")["Pod"])
    harness.binder.fail_with = "HTTP 409: pod is already assigned to node gpu-c"
    _, result = await post(harness, "bind", fixture("bind.json"))
    assert result["Error"].endswith("failed: HTTP 409: pod is already assigned to node gpu-c")
    assert harness.state.assumed == {}


async def test_bind_with_no_definite_answer_keeps_the_pod_held(harness: Harness) -> None:
    """A timed-out bind may have been stored: the memory stays charged until the watch says."""
    seed_cluster(harness)
    pod = fixture("filter-node-names.json")["Pod"]
    harness.state.on_pod("ADDED", pod)
    harness.binder.fail_with = "apiserver unreachable: read timed out"
    harness.binder.uncertain = True
    _, result = await post(harness, "bind", fixture("bind.json"))
    assert result["Error"].endswith("failed: apiserver unreachable: read timed out")
    assert set(harness.state.assumed) == {uid_of(pod)}
    # The watch shows the bind did land: the cache takes over the charge.
    harness.state.on_pod("MODIFIED", {**pod, "spec": {**pod["spec"], "nodeName": "gpu-b"}})
    assert harness.state.assumed == {}
    assert sum(1 for _ in harness.state.claims_on("gpu-b")) == 1


async def test_bind_of_a_pod_seen_only_in_filter(harness: Harness) -> None:
    """The pod watch may lag the scheduler: the filter request's pod is remembered."""
    seed_cluster(harness)
    await post(harness, "filter", fixture("filter-node-names.json"))
    _, result = await post(harness, "bind", fixture("bind.json"))
    assert result == {"Error": ""}


async def test_bind_of_an_unknown_pod(harness: Harness) -> None:
    seed_cluster(harness)
    _, result = await post(harness, "bind", fixture("bind.json"))
    assert "not in the extender's cache yet" in result["Error"]
    assert harness.binder.calls == []


async def test_burst_of_concurrent_binds_to_one_node_never_overcommits(harness: Harness) -> None:
    harness.state.on_node("ADDED", gpu_node("gpu-a", replicas=32))
    harness.binder.delay = 0.02  # every bind is in flight while the others arrive
    pods = [gpu_pod(f"burst-{i}", declared="10Gi") for i in range(20)]
    for pod in pods:
        harness.state.on_pod("ADDED", pod)
    binds = [
        {
            "PodName": p["metadata"]["name"],
            "PodNamespace": "research",
            "PodUID": uid_of(p),
            "Node": "gpu-a",
        }
        for p in pods
    ]
    answers = await asyncio.gather(*(post(harness, "bind", b) for b in binds))
    bound = [b for b, (_, r) in zip(binds, answers, strict=True) if r["Error"] == ""]
    refused = [r["Error"] for _, r in answers if r["Error"]]
    # 40 GiB - 0.5 GiB margin holds three 10 GiB pods, not four.
    assert len(bound) == 3
    assert len(harness.binder.calls) == 3
    assert len(refused) == 17
    assert all("headroom < 10.0 GiB declared" in error for error in refused)
    account = harness.state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].declared == 30 * GIB


async def test_burst_with_failing_binder_releases_everything(harness: Harness) -> None:
    harness.state.on_node("ADDED", gpu_node("gpu-a"))
    harness.binder.delay = 0.01
    harness.binder.fail_with = "HTTP 500: etcd timeout"
    pods = [gpu_pod(f"p{i}", declared="10Gi") for i in range(6)]
    for pod in pods:
        harness.state.on_pod("ADDED", pod)
    answers = await asyncio.gather(
        *(
            post(
                harness,
                "bind",
                {
                    "PodName": p["metadata"]["name"],
                    "PodNamespace": "research",
                    "PodUID": uid_of(p),
                    "Node": "gpu-a",
                },
            )
            for p in pods
        )
    )
    assert all(r["Error"] for _, r in answers)
    assert harness.state.assumed == {}
    account = harness.state.account("gpu-a")
    assert account is not None
    assert account.gpus[0].accounted == 0


BAD_FILTER_BODIES: list[tuple[bytes, int, str]] = [
    (b"{not json", 400, "not JSON"),
    (b"", 400, "not JSON"),
    (b"[]", 200, "ExtenderArgs"),
    (b'{"Pod": null, "NodeNames": ["a"]}', 200, "Pod: missing"),
    (b'{"Pod": {}, "NodeNames": null, "Nodes": null}', 200, "both null"),
    (b'{"Pod": {}, "NodeNames": "gpu-a"}', 200, "NodeNames"),
    (b'{"Pod": {}, "NodeNames": [1, 2]}', 200, "NodeNames.0"),
    (b'{"Pod": "pod", "NodeNames": []}', 200, "Pod"),
    (b'{"Pod": {"spec": {"containers": 3}}, "NodeNames": []}', 200, "Pod.spec.containers"),
    (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}', 200, "Nodes.items.0.metadata.name"),
    (b'{"Pod": {}, "Nodes": {"items": "x"}}', 200, "Nodes.items"),
]


@pytest.mark.parametrize(("body", "status", "named"), BAD_FILTER_BODIES)
async def test_filter_bad_input(harness: Harness, body: bytes, status: int, named: str) -> None:
    got, result = await post(harness, "filter", body)
    assert got == status
    assert named in result["Error"]
    if status == 200:
        assert result["NodeNames"] == []


@pytest.mark.parametrize(("body", "status", "named"), BAD_FILTER_BODIES)
async def test_prioritize_bad_input(harness: Harness, body: bytes, status: int, named: str) -> None:
    got, result = await post(harness, "prioritize", body)
    assert got == 400
    assert named in result["Error"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"PodNamespace": "ns", "Node": "n"}', "PodName"),
        (b'{"PodName": "", "PodNamespace": "ns", "Node": "n"}', "PodName"),
        (b'{"PodName": "p", "PodNamespace": "ns", "Node": 5}', "Node"),
        (b'"bind"', "ExtenderBindingArgs"),
    ],
)
async def test_bind_bad_input(harness: Harness, body: bytes, named: str) -> None:
    status, result = await post(harness, "bind", body)
    assert status == 200
    assert named in result["Error"]


async def test_oversized_bodies(harness: Harness) -> None:
    big = json.dumps({"Pod": {}, "NodeNames": ["n" * 100] * 12000}).encode()  # > 1 MiB cap here
    status, result = await post(harness, "filter", big)
    assert status == 200
    assert "over 1048576 bytes" in result["Error"]
    status, result = await post(harness, "prioritize", big)
    assert status == 413


async def test_service_endpoints(harness: Harness) -> None:
    seed_cluster(harness)
    await post(harness, "filter", fixture("filter-node-names.json"))
    assert (await harness.client.get("/healthz")).status == 200
    assert (await harness.client.get("/readyz")).status == 200
    harness.ready[0] = False
    assert (await harness.client.get("/readyz")).status == 503
    metrics = await (await harness.client.get("/metrics")).text()
    assert 'headroom_extender_requests_total{outcome="ok",verb="filter"} 1.0' in metrics
    assert "headroom_extender_nodes 2.0" in metrics
    state = await (await harness.client.get("/state")).json()
    gpu = state["nodes"]["gpu-a"]["gpus"][0]
    assert gpu["headroom"] == 40 * GIB - (10 + 10 + 16) * GIB - 2**29
    assert state["nodes"]["gpu-a"]["source"] == "report"
    only = await (await harness.client.get("/state", params={"node": "gpu-b"})).json()
    assert list(only["nodes"]) == ["gpu-b"]


async def test_node_list_fixture_matches_node_names_fixture() -> None:
    """Both fixtures carry the same pod; only the node-cache mode differs."""
    names_mode = fixture("filter-node-names.json")
    list_mode = fixture("filter-node-list.json")
    assert names_mode["Pod"] == list_mode["Pod"]
    assert names_mode["Nodes"] is None
    assert list_mode["NodeNames"] is None
    assert [n["metadata"]["name"] for n in list_mode["Nodes"]["items"]] == names_mode["NodeNames"]


async def test_filter_mig_pod_by_free_slices(harness: Harness) -> None:
    harness.state.on_node("ADDED", gpu_node("mig-a", replicas=1, mig={"3g.20gb": 2}))
    harness.state.on_node("ADDED", gpu_node("mig-b", replicas=1, mig={"3g.20gb": 2}))
    harness.state.on_node("ADDED", gpu_node("shared-only"))
    for i in range(2):
        harness.state.on_pod(
            "ADDED", gpu_pod(f"m{i}", node="mig-a", mig="3g.20gb", declared="18Gi")
        )
    args = {
        "Pod": gpu_pod("new", mig="3g.20gb", declared="18Gi"),
        "Nodes": None,
        "NodeNames": ["mig-a", "mig-b", "shared-only"],
    }
    _, result = await post(harness, "filter", args)
    assert result["NodeNames"] == ["mig-b"]
    assert result["FailedNodes"] == {
        "mig-a": "MIG 3g.20gb: 2 of 2 slices in use, 1 wanted",
        "shared-only": "node offers no nvidia.com/mig-3g.20gb",
    }
    _, scores = await post(harness, "prioritize", {**args, "NodeNames": ["mig-b"]})
    assert scores == [{"Host": "mig-b", "Score": 5}]  # binpack: one of two slices left


@pytest.mark.parametrize("profile", ["1g.18gb", "7g.141gb", "1g.10gb+me", "1g.24gb+gfx"])
async def test_filter_counts_slices_of_profiles_outside_the_built_in_table(
    harness: Harness, profile: str
) -> None:
    # The shipped managedResources now send pods of H200, B200 and media-variant slices
    # here too (manifests/base/scheduler/configmap.yaml): counted by the node's capacity.
    harness.state.on_node("ADDED", gpu_node("full", replicas=1, mig={profile: 1}))
    harness.state.on_node("ADDED", gpu_node("free", replicas=1, mig={profile: 1}))
    harness.state.on_pod("ADDED", gpu_pod("held", node="full", mig=profile, declared="1Gi"))
    args = {"Pod": gpu_pod("new", mig=profile, declared="1Gi"), "NodeNames": ["full", "free"]}
    _, result = await post(harness, "filter", args)
    assert result["NodeNames"] == ["free"]
    assert result["FailedNodes"] == {"full": f"MIG {profile}: 1 of 1 slices in use, 1 wanted"}


async def test_a_count_cut_to_64_bits_elsewhere_is_refused_and_charged_as_the_most(
    harness: Harness,
) -> None:
    # kube-scheduler reads 2^64 + 1 replicas as 1 and asks the extender; every count
    # here is exact, and the spread bound and the departures looped over it: the
    # event loop, and with it every tenant's scheduling, stopped for good.
    h = harness
    h.state.on_node("ADDED", gpu_node("gpu-a", gpus=8))
    huge = gpu_pod("huge", declared="1Gi")
    for section in ("limits", "requests"):
        huge["spec"]["containers"][0]["resources"][section]["nvidia.com/gpu.shared"] = str(
            2**64 + 1
        )
    status, result = await post(h, "filter", {"Pod": huge, "NodeNames": ["gpu-a"]})
    assert status == 200
    assert result["NodeNames"] == []
    assert "above 1024" in result["FailedAndUnresolvableNodes"]["gpu-a"]
    # Bound all the same (before the admission policy, say): charged, and gone in
    # a bounded number of departures.
    bound = gpu_pod("bound", declared="1Gi", node="gpu-a", phase="Running")
    for section in ("limits", "requests"):
        bound["spec"]["containers"][0]["resources"][section]["nvidia.com/gpu.shared"] = "100000"
    h.state.on_pod("ADDED", bound)
    account = h.state.account("gpu-a")
    assert account is not None
    assert all(len(gpu.pods) == 1 for gpu in account.gpus)
    h.state.on_pod("DELETED", bound)
    assert len(h.state.departures["gpu-a"]) == 1024


@pytest.mark.parametrize(
    ("verb", "status"), [("filter", 200), ("prioritize", 400), ("preempt", 400)]
)
async def test_a_pod_phase_that_is_not_a_string_is_named(
    harness: Harness, verb: str, status: int
) -> None:
    # It was read with ``in`` a set of phases: a list or an object raised TypeError,
    # answered as an internal error that named no field.
    pod = gpu_pod("odd", declared="1Gi")
    pod["status"]["phase"] = ["Pending"]
    body = {"Pod": pod, "NodeNames": ["gpu-a"], "NodeNameToMetaVictims": {}}
    got, result = await post(harness, verb, body)
    assert got == status
    assert "Pod.status.phase: expected a string" in result["Error"]
    assert "internal error" not in result["Error"]


@pytest.mark.parametrize(
    ("verb", "status"), [("filter", 200), ("bind", 200), ("prioritize", 400), ("preempt", 400)]
)
async def test_an_unexpected_failure_reaches_kube_scheduler_as_an_error(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, verb: str, status: int
) -> None:
    # kube-scheduler decodes a 200 preempt answer into ExtenderPreemptionResult and
    # drops unknown keys: {"Error": ...} read as "no node can be freed", silently
    # (extender.go ProcessPreemption). Only a non-200 status makes it an error.
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(harness.extender, verb, broken)
    if verb == "bind":
        body: dict[str, Any] = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n"}
    else:
        body = {"Pod": gpu_pod("p"), "NodeNames": ["gpu-a"], "NodeNameToMetaVictims": {}}
    got, result = await post(harness, verb, body)
    assert got == status
    assert "internal error: RuntimeError: a bug" in result["Error"]
    metrics = await (await harness.client.get("/metrics")).text()
    assert f'headroom_extender_requests_total{{outcome="internal-error",verb="{verb}"}} 1.0' in (
        metrics
    )
