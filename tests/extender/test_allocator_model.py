"""The extender's accounts against a model of kubelet and the device plugin's allocator.

Random storms on 1-3 nodes of 2-8 time-sliced GPUs: pods arrive through the
filter and the bind's hold, the pod watch shows binds late, kubelet allocates
bound pods in any order by NVIDIA's ``distributed`` policy (each replica to a
GPU with the fewest allocated; k8s-device-plugin internal/rm/allocate.go),
reports are taken, delayed and superseded, count each pod's replicas per GPU (or,
now and then, come from an agent that does not), NVML fails on a GPU now and then,
a faulty agent now and then lists one GPU under another's index (and leaves its own out),
pods use memory, end and are deleted, and time passes. In the ``lag`` world
kubelet frees a pod's replicas when its containers end, before its report and
the API show it; in ``strict`` it frees them when the watch shows the pod gone.
In the ``numa`` world kubelet's Topology Manager is on: a pod's replicas come
from the lowest NUMA node with room for them (devicemanager filterByAffinity),
spread over that node's GPUs only; a GPU with no NUMA node is used only when
no NUMA node has room; the agent reports each GPU's node from its start.
In the ``force`` world tenants force-delete running pods that trap SIGTERM (those of
several replicas more often, located or not, on one GPU or several): kubelet
drops such a pod from its active pods at once, and its device manager frees the
pod's replicas before the next allocation (kubernetes#104824), while the containers
run out their grace period, free to use all they declared; the agent, which no
longer knows the pod, reports what it holds as unattributed. kubelet reads its pods
in the apiserver's order, so the pods bound before the deletion are allocated first,
and the extender's pod watch shows the deletion before its next filter (a watch that
lags it is a limit the README names).

After every step, on every GPU, the memory the pods kubelet holds there
declare is no more than the extender charges that GPU, and no more than the GPU
holds less the margin. The cached accounts never promise more than freshly
worked-out ones. This is the model that found the two holes in the spread
bound of 2026-11-25 (a located pod kubelet had freed; a pod of two replicas). Pods
of one to three replicas arrive; the agent's counts locate those of several.
"""

import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from extender.state import HISTORY_SECONDS, ClusterState
from headroom.accounting import History, NodeAccount, account_key, account_node
from headroom.claims import DEFAULT_GRACE_SECONDS, parse_claim
from headroom.placement import fit
from headroom.reports import GPUUsage, PodUsage, ReportStatus, report_object
from tests.extender.conftest import MARGIN, Clock
from tests.extender.objects import GIB, Object, gpu_node, gpu_pod

MIB = 2**20
SEEDS = 40
STEPS = 120


@dataclass
class Pod:
    uid: str
    node: str
    declared: int
    replicas: int
    created: float
    gpus: list[int] = field(default_factory=list)
    """What kubelet allocated (empty until it admits the pod)."""
    ended: bool = False
    """Kubelet freed its replicas; the API may not show it yet."""
    used: int = 0

    def object(self, phase: str = "Running") -> Object:
        pod = gpu_pod(
            self.uid,
            node=self.node,
            declared=f"{self.declared // MIB}Mi",
            shared=self.replicas,
            uid=self.uid,
            phase=phase,
        )
        pod["metadata"]["creationTimestamp"] = iso(self.created)
        return pod


@dataclass
class Node:
    name: str
    gpus: int
    replicas: int
    memory_mib: int
    pods: dict[str, Pod] = field(default_factory=dict)
    in_flight: Object | None = None
    carried: dict[int, GPUUsage] = field(default_factory=dict)
    numa: list[int | None] | None = None
    """Each GPU's NUMA node with the Topology Manager on; None: it is off."""
    running_on: dict[str, tuple[float, Pod]] = field(default_factory=dict)
    """Pods force-deleted while they run, and when kubelet kills them at the latest (their
    grace period on): on their GPUs, in no count of the allocator's."""

    def allocated(self, gpu: int) -> int:
        return sum(p.gpus.count(gpu) for p in self.pods.values() if not p.ended)

    def offered(self, pod: Pod) -> list[int]:
        """The GPUs kubelet offers the device plugin for ``pod``."""
        if self.numa is None:
            return list(range(self.gpus))
        for node in sorted({n for n in self.numa if n is not None}):
            on = [g for g in range(self.gpus) if self.numa[g] == node]
            if sum(self.replicas - self.allocated(g) for g in on) >= pod.replicas:
                return on
        return list(range(self.gpus))

    def allocate(self, pod: Pod, rng: random.Random) -> None:
        chosen: list[int] = []
        offered = self.offered(pod)
        for _ in range(pod.replicas):
            count = {g: self.allocated(g) + chosen.count(g) for g in range(self.gpus)}
            free = [g for g in offered if count[g] < self.replicas]
            if not free:
                return  # kubelet refuses the pod: it holds nothing
            fewest = min(count[g] for g in free)
            chosen.append(rng.choice([g for g in free if count[g] == fewest]))
        pod.gpus = chosen

    def declared_on(self, gpu: int) -> int:
        pods = [*self.pods.values(), *(pod for _, pod in self.running_on.values())]
        return sum(p.declared for p in pods if not p.ended and gpu in p.gpus)

    def report(self, now: float, rng: random.Random) -> Object:
        gpus = []
        total = self.memory_mib * MIB
        counted = rng.random() < 0.9  # else an agent older than the replica counts
        for g in range(self.gpus):
            pods = [
                PodUsage(
                    uid=p.uid,
                    used_bytes=0 if p.ended else p.used,
                    allocated=True,
                    replicas=p.gpus.count(g) if counted else None,
                )
                for p in self.pods.values()
                if g in p.gpus
            ]
            stray = sum(p.used for _, p in self.running_on.values() if g in p.gpus)
            used = sum(u.used_bytes for u in pods) + stray
            gpu = GPUUsage(
                index=g,
                uuid=f"GPU-{self.name}-{g}",
                total_bytes=total,
                used_bytes=used,
                free_bytes=total - used,
                pods=pods,
                numa_node=None if self.numa is None else self.numa[g],
                unattributed_bytes=stray,
            )
            last = self.carried.get(g)
            if rng.random() < 0.05:  # NVML cannot read it: the agent carries its last figures
                gpu = GPUUsage(
                    index=g,
                    uuid=gpu.uuid,
                    total_bytes=total,
                    used_bytes=last.used_bytes if last else 0,
                    free_bytes=last.free_bytes if last else 0,
                    pods=list(last.pods) if last else [],
                    numa_node=last.numa_node if last else None,
                    error="NVML_ERROR_UNKNOWN",
                )
            else:
                self.carried[g] = gpu
            gpus.append(gpu)
        if self.gpus > 2 and rng.random() < 0.03:
            # An agent fault: one GPU's entry under another's index, its own left out.
            moved, under = rng.sample(range(self.gpus), 2)
            gpus = [replace(g, index=under) if g.index == moved else g for g in gpus]
        status = ReportStatus(
            node_name=self.name,
            backend="simulated",
            observed_at=datetime.fromtimestamp(now, UTC),
            gpus=gpus,
        )
        return report_object(status)


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def fresh(state: ClusterState, name: str, *, numa: bool = False) -> NodeAccount:
    """:func:`account_node` over what the state holds for the node now; with ``numa``,
    exactly what the state passes it (the NUMA topology its reports showed included)."""
    return account_node(
        state.nodes[name],
        list(state.claims_on(name)),
        state.reports.get(name),
        now=state.clock(),
        margin=state.margin,
        stale_after=state.stale_after,
        last_good=state.last_good.get(name),
        history=state.history(name),
        numa_seen=state._numa_seen.get(name) if numa else None,
    )


class Storm:
    def __init__(self, seed: int, lag: bool, numa: bool = False, force: bool = False) -> None:
        self.rng = rng = random.Random(seed)
        self.lag = lag
        self.force = force
        self.clock = Clock()
        self.state = ClusterState(margin=MARGIN, stale_after=90.0, clock=self.clock)
        self.nodes: dict[str, Node] = {}
        for i in range(rng.randint(1, 3)):
            node = Node(f"n{i}", rng.randint(2, 8), rng.randint(2, 6), rng.choice([16384, 40960]))
            if numa:
                width = rng.choice([1, 2, 4])
                node.numa = [None if rng.random() < 0.1 else g // width for g in range(node.gpus)]
            self.nodes[node.name] = node
            self.state.on_node(
                "ADDED",
                gpu_node(
                    node.name, gpus=node.gpus, memory_mib=node.memory_mib, replicas=node.replicas
                ),
            )
            if numa:  # the agent reports before the first pod: its GPUs' NUMA nodes
                self.state.on_report("ADDED", node.report(self.clock.now, rng))
        self.sizes = [rng.choice([1, 2, 3, 5, 8, 10, 13, 15, 20]) * GIB // rng.choice([1, 2])] * 2
        self.sizes += [rng.choice([1, 2, 3, 5, 8, 10, 13, 15, 20]) * GIB // 2 for _ in range(4)]
        self.count = 0
        self.log: list[str] = []

    def pods(self) -> list[Pod]:
        return [p for node in self.nodes.values() for p in node.pods.values()]

    def step(self) -> None:
        rng, state, now = self.rng, self.state, self.clock.now
        events = [
            *("arrive", "watch", "allocate", "end", "delete"),
            *("report", "deliver", "use", "tick"),
        ]
        weights = [30, 8, 25, 8 if self.lag else 0, 10, 10, 8, 6, 6]
        if self.force:
            events, weights = [*events, "force", "stop"], [*weights, 6, 3]
        event = rng.choices(events, weights)[0]
        pods = self.pods()
        if event == "force" and (running := [p for p in pods if p.gpus and not p.ended]):
            # Pods of several replicas more often: charged in full on each GPU they held.
            pod = rng.choices(running, [p.replicas**2 for p in running])[0]
            node = self.nodes[pod.node]
            # kubelet reads its pods in the apiserver's order: those bound before this
            # deletion are admitted (allocated) before it drops the deleted one.
            for admitted in [p for p in node.pods.values() if not p.gpus and not p.ended]:
                node.allocate(admitted, rng)
                admitted.ended = not admitted.gpus  # refused: it never runs
            del node.pods[pod.uid]
            node.running_on[pod.uid] = (now + DEFAULT_GRACE_SECONDS, pod)
            pod.used = rng.choice([0, pod.declared // 2])  # and free to grow to all of it
            state.on_pod("DELETED", pod.object())  # its containers still shown running
            _, claim = state.lingering[pod.node][pod.uid]
            # Where a report placed it, on every GPU it holds a replica of, none fewer.
            assert claim.home is None or claim.home == tuple(sorted(set(pod.gpus))), claim.home
            self.log.append(
                f"{now:.1f} {pod.uid} (x{pod.replicas} on {pod.gpus}, placed on {claim.home})"
                " force-deleted: runs on, its replicas free"
            )
        elif event == "stop" and (
            stopping := [(n, uid) for n in self.nodes.values() for uid in n.running_on]
        ):
            node, uid = rng.choice(stopping)
            del node.running_on[uid]
            self.log.append(f"{now:.1f} {uid} stops at last")
        elif event == "arrive":
            self.arrive()
        elif event == "watch" and (waiting := [p for p in pods if p.uid in state.assumed]):
            pod = rng.choice(waiting)
            state.on_pod("MODIFIED", pod.object())
            self.log.append(f"{now:.1f} watch shows {pod.uid} on {pod.node}")
        elif event == "allocate" and (waiting := [p for p in pods if not p.gpus and not p.ended]):
            pod = rng.choice(waiting)
            self.nodes[pod.node].allocate(pod, rng)
            self.log.append(f"{now:.1f} kubelet gives {pod.uid} GPUs {pod.gpus}")
        elif event == "end" and (running := [p for p in pods if not p.ended]):
            pod = rng.choice(running)
            pod.ended = True
            self.log.append(f"{now:.1f} {pod.uid} ends: kubelet frees its GPUs")
        elif event == "delete" and (
            gone := [p for p in pods if not self.lag or p.ended or rng.random() < 0.3]
        ):
            pod = rng.choice(gone)
            pod.ended = True
            state.on_pod("DELETED", pod.object())
            del self.nodes[pod.node].pods[pod.uid]
            self.log.append(f"{now:.1f} {pod.uid} deleted")
        elif event == "report":
            node = rng.choice(list(self.nodes.values()))
            report = node.report(now, rng)
            if rng.random() < 0.5:
                node.in_flight = None  # a newer report supersedes the one in flight
                state.on_report("MODIFIED", report)
                self.log.append(f"{now:.1f} report of {node.name}")
            else:
                node.in_flight = report
                self.log.append(f"{now:.1f} report of {node.name} taken, delivered later")
        elif event == "deliver":
            node = rng.choice(list(self.nodes.values()))
            if node.in_flight is not None:
                state.on_report("MODIFIED", node.in_flight)
                node.in_flight = None
                self.log.append(f"{now:.1f} late report of {node.name} delivered")
        elif event == "use" and (running := [p for p in pods if p.gpus and not p.ended]):
            pod = rng.choice(running)
            pod.used = rng.choice([0, pod.declared // 2, pod.declared])
        elif event == "tick":
            self.clock.now += rng.choice([1, 5, 30, 95])
        self.clock.now += 0.5
        for node in self.nodes.values():  # kubelet kills what runs past its grace period
            for uid in [u for u, (until, _) in node.running_on.items() if until <= self.clock.now]:
                del node.running_on[uid]

    def arrive(self) -> None:
        rng, state = self.rng, self.state
        self.count += 1
        replicas = rng.choices([1, 2, 3], [85, 10, 5])[0]
        pod = Pod(f"p{self.count}", "", rng.choice(self.sizes), replicas, self.clock.now)
        obj = pod.object(phase="Pending")
        state.on_pod("ADDED", obj)
        claim = parse_claim(obj)
        state.prepare(self.clock.now)
        names = list(self.nodes)
        if replicas == 1:
            passed, _ = state.verdicts.filter(names, claim, state.shared_headroom, state.accounts())
        else:
            passed = [name for name in names if state.fit(claim, name).fits]
        if not passed or not state.assume(claim, chosen := rng.choice(passed)).fits:
            state.on_pod("DELETED", obj)
            return
        pod.node = chosen
        self.nodes[chosen].pods[pod.uid] = pod
        self.log.append(
            f"{self.clock.now:.1f} {pod.uid} ({pod.declared / GIB}Gi x{replicas}) held on {chosen}"
        )
        if rng.random() < 0.6:
            state.on_pod("MODIFIED", pod.object())
            self.log.append(f"{self.clock.now:.1f} watch shows {pod.uid} on {chosen}")

    def check(self) -> None:
        state = self.state
        state.prepare(self.clock.now)
        for node in self.nodes.values():
            account = fresh(state, node.name)
            cached = state.account(node.name)
            assert cached is not None
            for gpu in account.gpus:
                truth = node.declared_on(gpu.index)
                where = f"{node.name} gpu {gpu.index}"
                assert truth <= gpu.total - MARGIN, f"{where} over-committed: {truth / GIB}Gi"
                assert truth <= gpu.accounted, f"{where} charged {gpu.accounted / GIB}Gi"
            # A pod bound longer than the history the extender keeps is charged on
            # every GPU when the node's account is next worked out; until an event
            # comes, the cached account stands: nothing it counted on has changed.
            since = state.history(node.name).since
            if any(c.created is not None and c.created < since for c in state.claims_on(node.name)):
                continue
            assert cached.shared_headroom <= account.shared_headroom, node.name
            for need in self.sizes:
                claim = parse_claim(gpu_pod("probe", declared=f"{need // MIB}Mi", uid="probe"))
                if fit(cached, claim).fits:
                    assert fit(account, claim).fits, f"{node.name} {need / GIB}Gi"


WORLDS = pytest.mark.parametrize(
    ("lag", "numa", "force"),
    [(False, False, False), (True, False, False), (True, True, False), (True, False, True)],
    ids=["strict", "lag", "lag-numa", "lag-force"],
)
"""Every world of the model: kubelet freeing replicas late or not, NUMA, force-deletions;
pods of one to three replicas in each."""


@WORLDS
def test_no_storm_over_commits_a_gpu_or_charges_less_than_it_holds(
    lag: bool, numa: bool, force: bool
) -> None:
    for seed in range(SEEDS):
        storm = Storm(seed, lag, numa, force)
        for _ in range(STEPS):
            storm.step()
            try:
                storm.check()
            except AssertionError as failure:
                trail = "\n".join(storm.log[-30:])
                raise AssertionError(f"seed {seed}: {failure}\n{trail}") from None


def inputs_at(state: ClusterState, name: str, at: float) -> dict[str, Any]:
    """What the state passes :func:`account_node` for the node, were the clock at ``at``."""
    since = max(state.watching_since, at - HISTORY_SECONDS)
    departures = tuple(d for d in state.departures.get(name, ()) if d[0] >= since)
    return {
        "node": state.nodes[name],
        "claims": list(state.claims_on(name)),
        "report": state.reports.get(name),
        "now": at,
        "margin": state.margin,
        "stale_after": state.stale_after,
        "last_good": state.last_good.get(name),
        "history": History(since, departures),
        "numa_seen": state._numa_seen.get(name),
    }


@WORLDS
def test_accounts_whose_keys_are_equal_are_equal(lag: bool, numa: bool, force: bool) -> None:
    # account_key leaves ``now`` out but for what it decides: the report's freshness
    # (90 s here), which pods the history covers (600 s, or since the pod watch's last
    # list), and which departures count on a node with no unlocated pod (30 s). Keys
    # a moment and a while apart: where equal, so are the accounts.
    equal = differ = 0
    for seed in range(SEEDS):
        storm = Storm(seed, lag, numa, force)
        for step in range(STEPS):
            storm.step()
            state = storm.state
            if step % 40 == 39:
                state.on_pod_resync()  # the history starts again now
            for name in storm.nodes:
                now = state.clock()
                first = inputs_at(state, name, now)
                for later in (now + 0.5, now + 20, now + 31, now + 95, now + 601):
                    second = inputs_at(state, name, later)
                    if account_key(**first) != account_key(**second):
                        differ += 1
                        continue
                    equal += 1
                    assert account_node(**first) == account_node(**second), (
                        f"seed {seed}: {name} at {now} and {later}"
                    )
    assert equal > SEEDS * STEPS
    assert differ > SEEDS * STEPS


@WORLDS
def test_an_account_kept_for_unchanged_inputs_is_the_one_worked_out_afresh(
    lag: bool, numa: bool, force: bool
) -> None:
    # The state hands back a node's last account when nothing it reads has changed
    # (extender.state ClusterState._work_out, headroom.accounting.account_key): after
    # every step, with the cached accounts dropped, what it hands back is exactly what
    # account_node works out now, time passing included (stale reports, the history's
    # start, departures ageing out of the window of a node with no unlocated pod).
    kept = 0
    for seed in range(SEEDS):
        storm = Storm(seed, lag, numa, force)
        last: dict[str, NodeAccount] = {}
        for _ in range(STEPS):
            storm.step()
            state = storm.state
            if storm.rng.random() < 0.05:
                state.on_pod_resync()  # the history starts again now
            state.on_resync()  # every account worked out again, or handed back
            for name in storm.nodes:
                account = state.account(name)
                assert account == fresh(state, name, numa=True), f"seed {seed}: {name}"
                kept += account is last.get(name)
                last[name] = account
    assert kept > SEEDS * STEPS  # the accounts were handed back, not only worked out
