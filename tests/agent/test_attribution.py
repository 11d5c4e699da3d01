"""Processes become pods; what belongs to no known pod is unattributed."""

from datetime import UTC, datetime, timedelta

from agent.attribution import build_status
from agent.cgroups import ContainerRef
from agent.probe import GPU, GPUProcess, MigDevice, ProbeUnavailable, Snapshot
from headroom.quantity import GIB, MIB
from headroom.reports import CONDITION_NVML_AVAILABLE, ReportStatus
from tests.agent.doubles import pod

CID_A = "a" * 64
CID_B = "b" * 64
NOW = datetime(2025, 1, 1, tzinfo=UTC)

CGROUPS = {
    100: ContainerRef("uid-a", CID_A),  # pod a, container "main"
    101: ContainerRef("uid-a", CID_A),  # a second process of the same container
    200: ContainerRef("uid-gone", CID_B),  # a pod this node's cache does not know
    300: ContainerRef("uid-b", None),  # pod b, pod-level cgroup
}
PODS = {
    "uid-a": pod("a", "uid-a", namespace="ml", container_id=CID_A),
    "uid-b": pod("b", "uid-b", namespace="ml"),
}


def resolve(pid: int) -> ContainerRef | None:
    return CGROUPS.get(pid)


def test_processes_are_summed_per_pod_and_the_rest_is_unattributed() -> None:
    gpu = GPU(
        index=0,
        uuid="GPU-1",
        product="NVIDIA A100-PCIE-40GB",
        total_bytes=40 * GIB,
        used_bytes=20 * GIB,
        free_bytes=20 * GIB,
        processes=(
            GPUProcess(pid=100, used_bytes=6 * GIB),
            GPUProcess(pid=101, used_bytes=2 * GIB),
            GPUProcess(pid=200, used_bytes=3 * GIB),  # unknown pod
            GPUProcess(pid=300, used_bytes=None),  # NVML cannot say
            GPUProcess(pid=999, used_bytes=1 * GIB),  # not in a pod at all
        ),
    )
    status = build_status(
        node_name="gpu-node-1",
        backend="nvml",
        observed_at=NOW,
        snapshot=Snapshot((gpu,)),
        failure=None,
        pods=PODS,
        resolve=resolve,
    )
    (usage,) = status.gpus
    assert [(p.uid, p.namespace, p.name, p.containers, p.used_bytes) for p in usage.pods] == [
        ("uid-a", "ml", "a", ["main"], 8 * GIB),
        ("uid-b", "ml", "b", [], 0),
    ]
    # 20 GiB used - 8 GiB attributed: the unknown pod, the host process, the
    # unmeasured process and the driver's own reservation all count here.
    assert usage.unattributed_bytes == 12 * GIB
    assert usage.pods[0].starved_bytes is None  # NVML never reports starvation
    condition = status.condition(CONDITION_NVML_AVAILABLE)
    assert condition is not None
    assert (condition.status, condition.reason) == ("True", "Initialized")


def test_mig_pods_are_listed_under_their_device() -> None:
    gpu = GPU(
        index=0,
        uuid="GPU-1",
        product="NVIDIA A100-SXM4-40GB",
        total_bytes=40 * GIB,
        used_bytes=6 * GIB,
        free_bytes=34 * GIB,
        mig_enabled=True,
        mig_devices=(
            MigDevice("MIG-1", "3g.20gb", 19968 * MIB, 5 * GIB, (GPUProcess(100, 5 * GIB),)),
        ),
    )
    status = build_status(
        node_name="n",
        backend="nvml",
        observed_at=NOW,
        snapshot=Snapshot((gpu,)),
        failure=None,
        pods=PODS,
        resolve=resolve,
    )
    (usage,) = status.gpus
    assert usage.pods == []
    assert [p.uid for p in usage.mig_devices[0].pods] == ["uid-a"]
    assert usage.unattributed_bytes == 1 * GIB


def test_condition_keeps_its_transition_time_until_it_flips() -> None:
    failure = ProbeUnavailable("NVMLLibraryNotFound", "x" * 5000)

    def tick(at: datetime, broken: bool, previous: ReportStatus | None = None) -> ReportStatus:
        return build_status(
            node_name="n",
            backend="nvml",
            observed_at=at,
            snapshot=None if broken else Snapshot(),
            failure=failure if broken else None,
            pods={},
            resolve=resolve,
            previous=previous,
        )

    first = tick(NOW, True)
    second = tick(NOW + timedelta(seconds=5), True, first)
    third = tick(NOW + timedelta(seconds=10), False, second)
    conditions = [s.conditions[0] for s in (first, second, third)]
    assert [c.last_transition_time for c in conditions] == [NOW, NOW, NOW + timedelta(seconds=10)]
    assert len(conditions[0].message) == 1024  # cut to the CRD's limit


def test_simulated_processes_name_their_pod_directly() -> None:
    gpu = GPU(
        index=0,
        uuid="GPU-1",
        product="sim",
        total_bytes=10 * GIB,
        used_bytes=10 * GIB,
        free_bytes=0,
        processes=(
            GPUProcess(None, 10 * GIB, pod_uid="uid-b", container="main", starved_bytes=GIB),
            GPUProcess(None, 0, pod_uid="uid-deleted", starved_bytes=0),
        ),
    )
    status = build_status(
        node_name="n",
        backend="simulated",
        observed_at=NOW,
        snapshot=Snapshot((gpu,)),
        failure=None,
        pods=PODS,
        resolve=resolve,
    )
    (usage,) = status.gpus
    assert [(p.uid, p.containers, p.starved_bytes) for p in usage.pods] == [
        ("uid-b", ["main"], GIB)
    ]
    assert status.conditions[0].reason == "Simulated"


def test_a_pod_given_the_gpu_is_listed_before_it_holds_memory() -> None:
    gpu = GPU(
        index=1,
        uuid="GPU-2",
        product="NVIDIA A100-PCIE-40GB",
        total_bytes=40 * GIB,
        used_bytes=3 * GIB,
        free_bytes=37 * GIB,
        processes=(GPUProcess(pid=100, used_bytes=3 * GIB),),
        # a holds memory too; b is still pulling its image; the third pod is not cached
        allocated=frozenset({"uid-a", "uid-b", "uid-not-cached"}),
    )
    mig = GPU(
        index=0,
        uuid="GPU-1",
        product="NVIDIA A100-SXM4-40GB",
        total_bytes=40 * GIB,
        used_bytes=0,
        free_bytes=40 * GIB,
        mig_enabled=True,
        mig_devices=(
            MigDevice("MIG-1", "3g.20gb", 19968 * MIB, 0, allocated=frozenset({"uid-b"})),
        ),
    )
    status = build_status(
        node_name="n",
        backend="nvml",
        observed_at=NOW,
        snapshot=Snapshot((mig, gpu)),
        failure=None,
        pods=PODS,
        resolve=resolve,
    )
    on_mig, whole = status.gpus
    assert [(p.uid, p.used_bytes, p.allocated) for p in whole.pods] == [
        ("uid-a", 3 * GIB, True),
        ("uid-b", 0, True),
    ]
    assert whole.unattributed_bytes == 0
    assert [(p.uid, p.name, p.allocated) for p in on_mig.mig_devices[0].pods] == [
        ("uid-b", "b", True)
    ]
    assert on_mig.pods == []


def test_a_pod_of_many_gpu_containers_lists_as_many_as_the_crd_takes() -> None:
    # 65 containers holding memory on one GPU: the CRD lists at most 64 names per pod,
    # and the apiserver refused every report of the node, which then went stale with
    # the pod's memory charged nowhere. The names are for people; the memory is summed.
    from headroom.reports import report_object
    from tests.agent.test_report_crd import problems, root_schema

    cids = [f"{i:064x}" for i in range(65)]
    wide = pod("wide", "uid-wide", namespace="ml")
    wide["status"]["containerStatuses"] = [
        {"name": f"c{i:02d}", "containerID": f"containerd://{cid}"} for i, cid in enumerate(cids)
    ]
    refs = {1000 + i: ContainerRef("uid-wide", cid) for i, cid in enumerate(cids)}
    gpu = GPU(
        index=0,
        uuid="GPU-0",
        product="A100",
        total_bytes=40 * GIB,
        used_bytes=65 * 100 * MIB,
        free_bytes=40 * GIB - 65 * 100 * MIB,
        processes=tuple(GPUProcess(pid, 100 * MIB) for pid in refs),
    )
    status = build_status(
        node_name="n",
        backend="nvml",
        observed_at=NOW,
        snapshot=Snapshot((gpu,)),
        failure=None,
        pods={"uid-wide": wide},
        resolve=refs.get,
    )
    (usage,) = status.gpus[0].pods
    assert usage.used_bytes == 65 * 100 * MIB
    assert len(usage.containers) == 64
    assert problems(root_schema(), report_object(status)) == []
