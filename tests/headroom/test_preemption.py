"""Victim choice per GPU for a higher-priority shared pod (issue 7 §4)."""

from hypothesis import given
from hypothesis import strategies as st

from headroom.preemption import (
    GPURoom,
    Resident,
    Victims,
    choose_victims,
    victims_on_gpu,
    victims_on_node,
)

GI = 2**30


def uids(victims: Victims | None) -> list[str]:
    assert victims is not None
    return [pod.uid for pod in victims.pods]


def test_a_pod_that_fits_needs_no_victims() -> None:
    gpu = GPURoom("0", 20 * GI, (Resident("a", 0, 4 * GI),))
    assert uids(victims_on_gpu(16 * GI, 100000, gpu)) == []


def test_the_issue_case_frees_one_gpu_full_of_priority_zero_pods() -> None:
    # Two 40Gi GPUs, each full of four 10Gi priority-0 pods; the preemptor declares 16Gi.
    gpus = [
        GPURoom(str(i), 0, tuple(Resident(f"g{i}p{j}", 0, 10 * GI) for j in range(4)))
        for i in range(2)
    ]
    chosen = choose_victims(16 * GI, 100000, gpus)
    assert chosen is not None
    assert chosen.gpu == "0"
    assert len(uids(chosen)) == 2
    assert all(uid.startswith("g0") for uid in uids(chosen))


def test_equal_or_higher_priority_pods_never_go() -> None:
    gpu = GPURoom("0", 0, (Resident("same", 5, 20 * GI), Resident("high", 9, 20 * GI)))
    assert victims_on_gpu(8 * GI, 5, gpu) is None


def test_lowest_priority_goes_first_and_unneeded_victims_are_reprieved() -> None:
    gpu = GPURoom(
        "0",
        0,
        (Resident("small0", 0, 2 * GI), Resident("big1", 1, 16 * GI), Resident("mid0", 0, 4 * GI)),
    )
    # Priority 0 frees only 6Gi; big1 must go, and then neither priority-0 pod is needed.
    assert uids(victims_on_gpu(16 * GI, 10, gpu)) == ["big1"]
    # 5Gi: the priority-0 pods suffice and big1 stays.
    assert sorted(uids(victims_on_gpu(5 * GI, 10, gpu))) == ["mid0", "small0"]


def test_a_pdb_protected_pod_is_spared_when_another_set_works() -> None:
    gpu = GPURoom(
        "0", 0, (Resident("guarded", 0, 10 * GI, protected=True), Resident("free", 1, 10 * GI))
    )
    chosen = victims_on_gpu(8 * GI, 100, gpu)
    assert uids(chosen) == ["free"]
    assert chosen is not None
    assert chosen.pdb_violations == 0


def test_a_gpu_without_pdb_violations_beats_one_with_fewer_victims() -> None:
    guarded = GPURoom("0", 0, (Resident("g", 0, 20 * GI, protected=True),))
    open_gpu = GPURoom("1", 0, (Resident("a", 0, 10 * GI), Resident("b", 0, 10 * GI)))
    chosen = choose_victims(16 * GI, 100, [guarded, open_gpu])
    assert chosen is not None
    assert chosen.gpu == "1"
    assert chosen.pdb_violations == 0


def test_a_pdb_is_violated_only_when_nothing_else_frees_room() -> None:
    guarded = GPURoom("0", 0, (Resident("g", 0, 20 * GI, protected=True),))
    chosen = choose_victims(16 * GI, 100, [guarded])
    assert uids(chosen) == ["g"]
    assert chosen is not None
    assert chosen.pdb_violations == 1


def test_victims_spread_over_gpus_are_not_combined() -> None:
    # 8Gi free on each of two GPUs is not 16Gi on one: each GPU must be freed on its own.
    gpus = [GPURoom(str(i), 8 * GI, (Resident(f"p{i}", 50, 8 * GI),)) for i in range(2)]
    assert choose_victims(24 * GI, 100, gpus) is None
    chosen = choose_victims(16 * GI, 100, gpus)
    assert chosen is not None
    assert len(chosen.pods) == 1


residents = st.lists(
    st.builds(
        Resident,
        uid=st.uuids().map(str),
        priority=st.integers(0, 5),
        memory=st.integers(1, 40).map(lambda g: g * GI),
        protected=st.booleans(),
    ),
    max_size=8,
)


@given(
    free=st.integers(-10, 40).map(lambda g: g * GI),
    pods=residents,
    need=st.integers(1, 40).map(lambda g: g * GI),
    priority=st.integers(0, 6),
)
def test_victims_free_enough_are_lower_priority_and_none_is_superfluous(
    free: int, pods: list[Resident], need: int, priority: int
) -> None:
    gpu = GPURoom("0", free, tuple(pods))
    chosen = victims_on_gpu(need, priority, gpu)
    lower = [pod for pod in pods if pod.priority < priority]
    if chosen is None:
        assert free + sum(pod.memory for pod in lower) < need
        return
    freed = free + sum(pod.memory for pod in chosen.pods)
    assert freed >= need
    assert all(pod.priority < priority for pod in chosen.pods)
    assert all(freed - pod.memory < need for pod in chosen.pods)
    unprotected = [pod for pod in lower if not pod.protected]
    if free + sum(pod.memory for pod in unprotected) >= need:
        assert chosen.pdb_violations == 0


def test_on_a_node_every_shared_gpu_short_of_room_is_freed() -> None:
    # The device plugin may hand the pod either GPU, so both must fit 16Gi.
    gpus = [
        GPURoom("0", 0, (Resident("a0", 0, 10 * GI), Resident("b0", 0, 10 * GI))),
        GPURoom("1", 8 * GI, (Resident("a1", 0, 10 * GI),)),
    ]
    chosen = victims_on_node(16 * GI, 100, gpus)
    assert chosen is not None
    assert sorted(uids(chosen)) == ["a0", "a1", "b0"]


def test_a_pod_charged_on_every_gpu_frees_every_gpu_once_chosen() -> None:
    everywhere = Resident("unlocated", 0, 16 * GI)
    gpus = [GPURoom(str(i), 0, (everywhere, Resident(f"p{i}", 1, 4 * GI))) for i in range(2)]
    assert uids(victims_on_node(16 * GI, 100, gpus)) == ["unlocated"]
    assert victims_on_node(40 * GI, 100, gpus) is None
