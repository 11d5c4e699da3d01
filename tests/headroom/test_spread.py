"""The bound on unlocated pods per GPU against a model of the device plugin's allocator.

The model is NVIDIA's ``distributed`` policy (k8s-device-plugin
internal/rm/allocate.go): kubelet allocates bound pods in any order, each
single replica to a GPU with the fewest allocated replicas (ties broken any
way), never beyond a GPU's replicas; the agent locates allocated pods whenever
it reports; pods leave at any time. At every step, each GPU must hold no more
unlocated pods than :func:`headroom.spread.most_on_gpu` allows it.
"""

import itertools
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.spread import most_on_gpu, most_with_gone


@dataclass
class Pod:
    created: int
    gpu: int | None = None
    located: bool = False
    located_at: int | None = None


@dataclass
class Node:
    gpus: int
    replicas: int
    pods: dict[int, Pod] = field(default_factory=dict)
    departures: list[tuple[int, int | None]] = field(default_factory=list)

    def allocated(self, gpu: int) -> int:
        return sum(1 for p in self.pods.values() if p.gpu == gpu)

    def check(self) -> None:
        unlocated = [p for p in self.pods.values() if not p.located]
        if not unlocated:
            return
        window = min(p.created for p in unlocated)
        left = [gpu for at, gpu in self.departures if at >= window]
        bounds = {
            h: sum(1 for p in self.pods.values() if p.located and p.gpu == h) + left.count(h)
            for h in range(self.gpus)
        }
        for g in range(self.gpus):
            actual = sum(1 for p in unlocated if p.gpu == g)
            own = sum(1 for p in self.pods.values() if p.located and p.gpu == g)
            most = most_on_gpu(g, len(unlocated), bounds, left.count(None), own)
            assert actual <= most, (g, actual, self)


events = st.lists(
    st.tuples(
        st.sampled_from(["bind", "allocate", "locate", "leave", "leave-located"]),
        st.integers(0, 10**6),
    ),
    max_size=120,
)


@settings(max_examples=1500, deadline=None)
@given(gpus=st.integers(1, 8), replicas=st.integers(1, 6), script=events)
def test_no_allocation_order_puts_more_unlocated_pods_on_a_gpu_than_the_bound(
    gpus: int, replicas: int, script: list[tuple[str, int]]
) -> None:
    node = Node(gpus, replicas)
    for clock, (event, pick) in enumerate(script):
        pods = sorted(node.pods)
        if event == "bind":
            node.pods[clock] = Pod(created=clock)
        elif event == "allocate":
            waiting = [uid for uid in pods if node.pods[uid].gpu is None]
            free = [g for g in range(gpus) if node.allocated(g) < replicas]
            if not waiting or not free:
                continue
            fewest = min(node.allocated(g) for g in free)
            ties = [g for g in free if node.allocated(g) == fewest]
            node.pods[waiting[pick % len(waiting)]].gpu = ties[(pick // 7) % len(ties)]
        elif event == "locate":
            placed = [uid for uid in pods if node.pods[uid].gpu is not None]
            if placed:
                chosen = node.pods[placed[pick % len(placed)]]
                if not chosen.located:
                    chosen.located, chosen.located_at = True, clock
        elif event == "leave" and pods:
            gone = node.pods.pop(pods[pick % len(pods)])
            node.departures.append((clock, gone.gpu if gone.located else None))
        elif event == "leave-located":
            located = [uid for uid in pods if node.pods[uid].located]
            if located:
                gone = node.pods.pop(located[pick % len(located)])
                node.departures.append((clock, gone.gpu))
        node.check()


def test_an_eight_gpu_node_with_no_history_spreads_its_pods() -> None:
    # 10 pods just bound to an empty 8-GPU node: none has two more than another.
    assert most_on_gpu(0, 10, dict.fromkeys(range(1, 8), 0)) == 2
    assert most_on_gpu(0, 8, dict.fromkeys(range(1, 8), 0)) == 1
    assert most_on_gpu(0, 0, dict.fromkeys(range(1, 8), 0)) == 0


def test_a_gpu_whose_neighbours_are_busy_can_take_all_newcomers() -> None:
    # Every other GPU holds 3 located pods: the first 4 newcomers may all land here.
    assert most_on_gpu(0, 4, dict.fromkeys(range(1, 8), 3)) == 4
    assert most_on_gpu(0, 12, dict.fromkeys(range(1, 8), 3)) == 5


def test_one_gpu_takes_everything() -> None:
    assert most_on_gpu(0, 5, {}) == 5


def test_pods_that_left_a_gpu_still_bound_the_newcomers_it_did_not_get() -> None:
    # GPU 1 held three located pods; three newcomers went to GPU 0 (the fewest
    # allocated); then the three left. Without counting them, GPU 1 would look
    # empty and GPU 0 could not hold three unlocated pods; it does.
    node = Node(gpus=2, replicas=8)
    for uid in range(3):
        node.pods[uid] = Pod(created=uid, gpu=1, located=True, located_at=uid)
    for uid in range(3, 6):
        node.pods[uid] = Pod(created=uid, gpu=0)
    for clock, uid in enumerate(range(3), start=6):
        node.pods.pop(uid)
        node.departures.append((clock, 1))
    node.check()
    assert most_on_gpu(0, 3, {1: 0}) == 2  # what forgetting them would allow


def test_pods_that_left_unlocated_count_as_having_left_any_gpu() -> None:
    # As above, but the three on GPU 1 were never located: their departures say
    # only that they left some GPU.
    node = Node(gpus=2, replicas=8)
    for uid in range(3):
        node.pods[uid] = Pod(created=uid, gpu=1)
    for uid in range(3, 6):
        node.pods[uid] = Pod(created=uid, gpu=0)
    for clock, uid in enumerate(range(3), start=6):
        node.pods.pop(uid)
        node.departures.append((clock, None))
    node.check()
    assert most_on_gpu(0, 3, {1: 0}, anywhere=0) == 2  # what forgetting them would allow


def test_a_gpu_with_more_located_pods_gets_no_newcomer() -> None:
    # GPU 0 holds four located pods, the others three: the device plugin gives
    # the next pod one of the others (whenever GPU 0's four came).
    others = dict.fromkeys(range(1, 8), 3)
    assert most_on_gpu(0, 1, others | {0: 4}, own=4) == 0
    assert most_on_gpu(1, 1, others | {0: 4}, own=3) == 1


def _one_at_a_time(
    gpu: int, unlocated: int, others: dict[int, int], anywhere: int, own: int, least: list[int]
) -> tuple[int, ...]:
    """most_with_gone as first written: one replica more at a time, while the bound holds."""
    bounds = [count for index, count in others.items() if index != gpu]
    result = []
    most = 0
    for j in range(own + 1):
        below = own - j - 1
        most = min(max(most, least[j] if j < len(least) else 0), unlocated)
        while most < unlocated:
            more = most + 1
            level = more + below
            short = sum(level - count for count in bounds if count < level)
            if more + max(0, short - anywhere) > unlocated:
                break
            most = more
        result.append(most)
    return tuple(result)


@settings(max_examples=1000, deadline=None)
@given(
    gpu=st.integers(0, 7),
    unlocated=st.integers(0, 40),
    others=st.dictionaries(st.integers(0, 7), st.integers(0, 12), max_size=8),
    anywhere=st.integers(0, 10),
    own=st.integers(0, 6),
    least=st.lists(st.integers(0, 45), max_size=8),
)
def test_the_search_by_halves_finds_what_one_replica_at_a_time_finds(
    gpu: int, unlocated: int, others: dict[int, int], anywhere: int, own: int, least: list[int]
) -> None:
    assert most_with_gone(gpu, unlocated, others, anywhere, own, least) == _one_at_a_time(
        gpu, unlocated, others, anywhere, own, least
    )


def _satisfies(more: int, unlocated: int, bounds: list[int], anywhere: int, own: int) -> bool:
    """The module's inequality for ``x_g = more``, as its docstring writes it."""
    short = sum(max(0, more - 1 + own - count) for count in bounds)
    return more + max(0, short - anywhere) <= unlocated


def test_the_search_by_halves_finds_the_most_the_bound_allows_in_every_small_case() -> None:
    # Not against the search it replaced, but against the inequality itself: for each
    # j, the largest x_g in 0..unlocated that satisfies it with own - j located, in
    # every case of up to three other GPUs (or none) of up to three replicas each.
    # ``least`` as _spread passes it: the answer with one replica fewer, or none.
    absent = -1
    cases = 0
    for counts in itertools.product(range(absent, 4), repeat=3):
        others = {h + 1: c for h, c in enumerate(counts) if c != absent}
        bounds = list(others.values())
        for unlocated, anywhere, own in itertools.product(range(8), range(4), range(4)):
            expected = tuple(
                max(
                    x
                    for x in range(unlocated + 1)
                    if _satisfies(x, unlocated, bounds, anywhere, own - j)
                )
                if _satisfies(0, unlocated, bounds, anywhere, own - j)
                else 0
                for j in range(own + 1)
            )
            fewer = most_with_gone(0, max(unlocated - 1, 0), others, anywhere, own)
            for least in ((), fewer if unlocated else ()):
                assert most_with_gone(0, unlocated, others, anywhere, own, least) == expected, (
                    unlocated,
                    others,
                    anywhere,
                    own,
                    least,
                )
                cases += 1
    assert cases > 10_000
