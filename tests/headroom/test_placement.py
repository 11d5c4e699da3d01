"""Fit reasons people can read, and 0..10 scores for binpack and spread."""

from dataclasses import replace
from typing import Any

from headroom.accounting import NodeAccount, account_node
from headroom.claims import PodClaim
from headroom.nodes import MigSlices, NodeGPUs
from headroom.placement import fit, score, shared_scores

GIB = 2**30
MARGIN = GIB // 2


def node(name: str, *, gpus: int = 1, memory_gib: int = 40, **kw: object) -> NodeGPUs:
    return NodeGPUs(
        name=name,
        product="NVIDIA-A100-PCIE-40GB",
        count=gpus,
        memory_bytes=memory_gib * GIB,
        shared_capacity=4 * gpus,
        **kw,  # type: ignore[arg-type]
    )


def claim(declared_gib: float | None, **kw: Any) -> PodClaim:
    memory = None if declared_gib is None else int(declared_gib * GIB)
    new = PodClaim(uid="new", namespace="ns", name="new", shared=1, declared=memory)
    return replace(new, **kw)


def used(name: str, gib: float) -> PodClaim:
    return PodClaim(
        uid=name, namespace="ns", name=name, node="x", shared=1, declared=int(gib * GIB)
    )


def accounted(gpus: NodeGPUs, *claims: PodClaim) -> NodeAccount:
    return account_node(gpus, claims, None, now=0.0, margin=MARGIN, stale_after=90.0)


def test_reason_names_gpu_headroom_declaration_and_why_only_declarations() -> None:
    account = accounted(node("a"), used("sim", 10), used("inf", 10), used("x", 13.5))
    verdict = fit(account, claim(10))
    assert not verdict.fits
    assert verdict.reason == (
        "gpu 0 NVIDIA-A100-PCIE-40GB: 6.0 GiB headroom < 10.0 GiB declared "
        "(no GPUNodeReport from the node agent: declarations and labels only)"
    )


def test_exact_fit_passes_one_byte_more_does_not() -> None:
    account = accounted(node("a"), used("sim", 20))
    room = account.shared_headroom
    assert fit(account, replace(claim(0), declared=room)).fits
    assert not fit(account, replace(claim(0), declared=room + 1)).fits


def test_overcommitted_node_refuses_even_an_empty_declaration() -> None:
    account = accounted(node("a", memory_gib=16), used("big", 20))
    verdict = fit(account, claim(0))
    assert not verdict.fits
    assert "-4.5 GiB headroom < 0 B declared" in verdict.reason


def test_a_legacy_pod_is_refused_with_the_fix() -> None:
    # Shared, no headroom.dev/gpu-memory: admitted by 0.1. Even an empty GPU
    # refuses it, saying why and how to recreate it.
    verdict = fit(accounted(node("a")), claim(None))
    assert not verdict.fits
    assert "legacy pod" in verdict.reason
    assert "headroom.dev/gpu-memory" in verdict.reason
    assert "rollout restart" in verdict.reason


def test_node_without_gpu_memory_label() -> None:
    broken = replace(node("a"), memory_bytes=0, problems=("label nvidia.com/gpu.memory missing",))
    verdict = fit(accounted(broken), claim(1))
    assert not verdict.fits
    assert "nvidia.com/gpu.memory missing" in verdict.reason


def test_claim_problem_is_the_reason() -> None:
    verdict = fit(accounted(node("a")), claim(1, problem="annotation x is bad"))
    assert verdict == replace(verdict, fits=False, reason="annotation x is bad")


def test_mig_fit_counts_slices() -> None:
    mig = {"3g.20gb": MigSlices("3g.20gb", 2, 19968 * 2**20)}
    want = claim(18, shared=0, mig={"3g.20gb": 1})
    holder = replace(used("m", 18), shared=0, mig={"3g.20gb": 1})
    assert fit(accounted(node("a", mig=mig), holder), want).fits
    verdict = fit(accounted(node("a", mig=mig), holder, replace(holder, uid="m2")), want)
    assert not verdict.fits
    assert verdict.reason == "MIG 3g.20gb: 2 of 2 slices in use, 1 wanted"
    verdict = fit(accounted(node("a")), want)
    assert verdict.reason == "node offers no nvidia.com/mig-3g.20gb"


def test_binpack_prefers_the_fullest_node_that_fits_spread_the_emptiest() -> None:
    nodes = {
        "empty": accounted(node("empty")),
        "half": accounted(node("half"), used("a", 20)),
        "full": accounted(node("full"), used("a", 30)),
    }
    pod = claim(8)
    binpack = {name: score(acc, pod, "binpack") for name, acc in nodes.items()}
    spread = {name: score(acc, pod, "spread") for name, acc in nodes.items()}
    assert binpack["full"] > binpack["half"] > binpack["empty"]
    assert spread["empty"] > spread["half"] > spread["full"]
    assert all(0 <= value <= 10 for value in (*binpack.values(), *spread.values()))
    # The pod's own annotation decides when none is given.
    assert score(nodes["full"], replace(pod, placement="spread")) == spread["full"]


def test_score_is_zero_where_the_pod_does_not_fit() -> None:
    account = accounted(node("a"), used("a", 39))
    assert score(account, claim(8), "binpack") == 0
    assert score(account, claim(8), "spread") == 0


def test_mig_scores_by_free_slices() -> None:
    mig = {"1g.5gb": MigSlices("1g.5gb", 7, 4864 * 2**20)}
    want = claim(4, shared=0, mig={"1g.5gb": 1})
    busy = accounted(node("busy", mig=mig), replace(used("m", 4), shared=0, mig={"1g.5gb": 5}))
    idle = accounted(node("idle", mig=mig))
    assert score(busy, want, "binpack") > score(idle, want, "binpack")
    assert score(busy, want, "spread") < score(idle, want, "spread")


def test_shared_scores_from_flat_figures_equal_score() -> None:
    accounts = [accounted(node("a"), used("x", gib)) for gib in (0, 7.5, 20, 31, 39)]
    figures = [(account.shared_headroom, account.shared_total) for account in accounts]
    for placement in ("binpack", "spread"):
        pod = claim(8, placement=placement)
        assert shared_scores([*figures, None], pod.need, placement == "spread") == [
            *(score(account, pod) for account in accounts),
            0,  # a node the cache does not hold
        ]
