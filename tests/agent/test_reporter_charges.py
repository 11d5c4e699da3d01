"""A report is written when what the extender charges a GPU rises: checked against
headroom.accounting itself, for the cases a review found the declaration floor hid."""

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

from agent.guard import Pod, declarations
from agent.reporter import WritePolicy, change_reason
from headroom.accounting import account_node
from headroom.claims import parse_claim
from headroom.nodes import NodeGPUs
from headroom.quantity import GIB, MIB
from headroom.reports import Condition, GPUUsage, PodUsage, ReportStatus
from tests.agent.doubles import pod

TOTAL = 80 * GIB  # 1 % = 819 MiB: more than rise_bytes (256 MiB) and the 512 MiB margin
MARGIN = 512 * MIB
WHEN = datetime(2025, 1, 1, tzinfo=UTC)


def node(count: int) -> NodeGPUs:
    return NodeGPUs(
        name="gpu-node-1",
        product="H100",
        count=count,
        confirmed=count,
        memory_bytes=TOTAL,
        replicas=4,
        shared_capacity=4 * count,
    )


def accounted(gpus: NodeGPUs, pods: Mapping[str, Pod], report: ReportStatus) -> list[int]:
    """What the extender charges each GPU from ``report`` (headroom.accounting)."""
    claims = [parse_claim(p) for p in pods.values()]
    now = report.observed_at.timestamp() + 1
    account = account_node(gpus, claims, report, now=now, margin=MARGIN, stale_after=90)
    assert account.source == "report"
    return [g.accounted for g in account.gpus]


def gpu(index: int, pods: list[PodUsage]) -> GPUUsage:
    used = sum(p.used_bytes for p in pods)
    return GPUUsage(
        index=index,
        uuid=f"GPU-{index}",
        total_bytes=TOTAL,
        used_bytes=used,
        free_bytes=TOTAL - used,
        pods=pods,
    )


def report(gpus: list[GPUUsage]) -> ReportStatus:
    up = Condition(type="NVMLAvailable", status="True", reason="Initialized")
    return ReportStatus(
        node_name="gpu-node-1", backend="nvml", observed_at=WHEN, gpus=gpus, conditions=[up]
    )


def test_stray_memory_on_a_gpu_not_allocated_is_charged_as_held() -> None:
    """b was given GPU 0 but also holds memory on GPU 1 (NVIDIA_VISIBLE_DEVICES):
    the extender charges it there what it holds, not max(declared, held). a, on
    GPU 1, gives back 800 MiB below its declaration while b's stray grows 800 MiB:
    GPU 1's used is unmoved, the charge rises 800 MiB, and nothing is written."""
    pods = {u: pod(u, u, namespace="ml", memory="20Gi") for u in ("a", "b")}

    def state(a: int, stray: int) -> ReportStatus:
        return report(
            [
                gpu(
                    0,
                    [
                        PodUsage(
                            uid="b", namespace="ml", name="b", used_bytes=5 * GIB, allocated=True
                        )
                    ],
                ),
                gpu(
                    1,
                    [
                        PodUsage(uid="a", namespace="ml", name="a", used_bytes=a, allocated=True),
                        PodUsage(uid="b", namespace="ml", name="b", used_bytes=stray),
                    ],
                ),
            ]
        )

    old = state(10 * GIB, 2 * GIB)
    new = state(10 * GIB - 800 * MIB, 2 * GIB + 800 * MIB)
    before, after = accounted(node(2), pods, old), accounted(node(2), pods, new)
    assert after[1] - before[1] == 800 * MIB  # the extender's charge of GPU 1 rose
    policy = WritePolicy()
    assert after[1] - before[1] > policy.rise_bytes
    assert change_reason(old, new, policy, declarations(pods)) is not None


def test_a_pod_kubelet_has_not_listed_is_charged_what_it_holds() -> None:
    """The report lists kubelet's allocations, but not b's (kubelet's PodResources
    went down before b started, or answered in part): b has no one GPU, and the
    extender charges what it holds on top of its declaration. b's rise below its
    declaration, while a gives as much back below its own, is a rise of the charge."""
    pods = {u: pod(u, u, namespace="ml", memory="20Gi") for u in ("a", "b")}

    def state(moved: int) -> ReportStatus:
        a = PodUsage(uid="a", namespace="ml", name="a", used_bytes=10 * GIB - moved, allocated=True)
        b = PodUsage(uid="b", namespace="ml", name="b", used_bytes=2 * GIB + moved)
        return report([gpu(0, [a, b])])

    old, new = state(0), state(800 * MIB)
    assert accounted(node(1), pods, new)[0] - accounted(node(1), pods, old)[0] == 800 * MIB
    assert change_reason(old, new, WritePolicy(), declarations(pods)) is not None


def test_many_small_rises_add_up() -> None:
    """Per pod, a rise of the charge is judged alone: four leaking pods (above their
    declarations) each taking 250 MiB, while four others give back as much below
    theirs, raise the GPU's charge by 1000 MiB (twice the margin) and GPU used not
    at all. Nothing is written (before a029ecb too) until the heartbeat."""
    pods = {f"l{i}": pod(f"l{i}", f"l{i}", namespace="ml", memory="4Gi") for i in range(4)}
    pods |= {f"q{i}": pod(f"q{i}", f"q{i}", namespace="ml", memory="10Gi") for i in range(4)}

    def state(moved: int) -> ReportStatus:
        usage = [
            PodUsage(uid=f"l{i}", namespace="ml", name=f"l{i}", used_bytes=5 * GIB + moved)
            for i in range(4)
        ]
        usage += [
            PodUsage(uid=f"q{i}", namespace="ml", name=f"q{i}", used_bytes=5 * GIB - moved)
            for i in range(4)
        ]
        return report([gpu(0, usage)])

    old, new = state(0), state(250 * MIB)
    before, after = accounted(node(1), pods, old)[0], accounted(node(1), pods, new)[0]
    assert after - before == 1000 * MIB
    assert change_reason(old, new, WritePolicy(), declarations(pods)) is not None


def test_unattributed_memory_adds_to_the_pods_rises() -> None:
    """The extender charges a GPU its pods' charges and its unattributed memory: b
    (over its declaration) and unattributed memory each rise 250 MiB while a gives
    500 MiB back below its own; the GPU's used is unmoved, its charge up 500 MiB."""
    pods = {
        "a": pod("a", "a", namespace="ml", memory="20Gi"),
        "b": pod("b", "b", namespace="ml", memory="4Gi"),
    }

    def state(moved: int) -> ReportStatus:
        a = PodUsage(
            uid="a", namespace="ml", name="a", used_bytes=10 * GIB - 2 * moved, allocated=True
        )
        b = PodUsage(uid="b", namespace="ml", name="b", used_bytes=5 * GIB + moved, allocated=True)
        usage = gpu(0, [a, b])
        spare = GIB + moved
        return report(
            [
                replace(
                    usage,
                    used_bytes=usage.used_bytes + spare,
                    free_bytes=usage.free_bytes - spare,
                    unattributed_bytes=spare,
                )
            ]
        )

    old, new = state(0), state(250 * MIB)
    assert old.gpus[0].used_bytes == new.gpus[0].used_bytes
    assert accounted(node(1), pods, new)[0] - accounted(node(1), pods, old)[0] == 500 * MIB
    assert change_reason(old, new, WritePolicy(), declarations(pods)) is not None


def test_a_pod_no_longer_on_one_gpu_is_written() -> None:
    """A report without kubelet's allocations places a pod where it holds memory. b
    held memory on GPU 0 only; a process of it on GPU 1 that NVML reads as 1 MiB
    places it on no one GPU, so the extender charges it on both: GPU 1's charge
    rises by b's declaration, though b's figures moved by 1 MiB."""
    pods = {"b": pod("b", "b", namespace="ml", memory="20Gi")}

    def state(stray: int) -> ReportStatus:
        b = [PodUsage(uid="b", namespace="ml", name="b", used_bytes=5 * GIB)]
        there = [PodUsage(uid="b", namespace="ml", name="b", used_bytes=stray)]
        return report([gpu(0, b), gpu(1, there)])

    old, new = state(0), state(MIB)
    assert accounted(node(2), pods, new)[1] - accounted(node(2), pods, old)[1] > 19 * GIB
    assert change_reason(old, new, WritePolicy(), declarations(pods)) == "pods located differently"
