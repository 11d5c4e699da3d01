"""The extender's watches: nodes, pods and GPUNodeReports into one ClusterState.

Pods are watched cluster-wide minus terminated ones (a field selector, so a
pod that finishes arrives as DELETED); the state keeps only GPU pods. The
extender is ready once every watch has listed once. With ``--leader-lease`` the
scheduler's Lease is watched as well (extender.leadership). PodDisruptionBudgets are
watched for the ``preempt`` verb only, and outside readiness: without them
preemption keeps kube-scheduler's own PDB count (extender.preemption), while a
blind node, pod or report watch could over-commit. The informers keep only
each object's identity (kube.informer.identity): the state keeps what it uses.
They list and watch over kube.rest on the event loop: no thread per watch, nor
the per-thread heaps that glibc keeps for them.
"""

from collections.abc import Mapping
from typing import Any

from extender.capacity import CapacityAdvertiser
from extender.leadership import Leadership
from extender.state import ClusterState
from headroom import names
from kube.informer import Handler, Informer, Resource, identity
from kube.rest import Rest

LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
"""Pods not yet ended: what ``headroom top`` lists. Not the extender's pod watch: a
watch with this selector delivers a pod's end as DELETED with the pod as it was
before (kube-apiserver sends the previous object when one stops matching:
k8s.io/apiserver pkg/storage/cacher/cache_watcher.go), so kubelet's last statuses,
which say the containers stopped, would never be seen, and a pod that ended could
not be told from one deleted while it ran."""
BLIND_LIMIT_SECONDS = 15.0
"""A watch broken this long without a good re-list: the extender's view may be missing
binds and deletions, so it goes not-ready and answers filter and bind with an Error
(issue 7: the apiserver was down 23 s and /readyz said 200 throughout)."""


WATCH_CONNECTIONS = 8
"""For the informers' :class:`kube.rest.Rest`: one held by each of the (up to five)
watches, and room for their lists."""


class Caches:
    def __init__(
        self,
        rest: Rest,
        state: ClusterState,
        advertiser: CapacityAdvertiser | None = None,
        budgets: Handler | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        """``rest``: the informers hold one connection each for their watch. With a
        ``leadership`` that names a lease, that Lease is watched too, and a blind lease
        watch makes the extender not ready (a leader change could go unseen)."""
        reports = f"/apis/{names.GROUP}/{names.VERSION}/{names.REPORT_PLURAL}"

        def on_node(kind: str, obj: Mapping[str, Any]) -> None:
            state.on_node(kind, obj)
            if advertiser is not None:
                advertiser.on_node(kind, obj)

        self.pods = Informer(
            # Every pod, ended ones too (LIVE_PODS says why); the state keeps an ended
            # pod only while it lingers (ClusterState._linger_on), the informer only
            # its UID (``identity``).
            Resource(rest, "/api/v1/pods"),
            name="pods",
            handler=state.on_pod,
            on_resync=state.on_pod_resync,
            keep=identity,
        )
        """Listed again on demand after a restart or a lease change (extender.leadership)."""
        self.informers: tuple[Informer, ...] = (
            Informer(
                Resource(rest, "/api/v1/nodes"),
                name="nodes",
                handler=on_node,
                on_resync=state.on_resync,
                keep=identity,
            ),
            self.pods,
            Informer(
                Resource(rest, reports),
                name=names.REPORT_PLURAL,
                handler=state.on_report,
                on_resync=state.on_resync,
                keep=identity,
            ),
        )
        path = leadership.path() if leadership is not None else None
        if leadership is not None and path is not None:
            self.informers += (
                Informer(
                    Resource(rest, path, fieldSelector=f"metadata.name={leadership.name}"),
                    name="leases",
                    handler=leadership.on_lease,
                    keep=identity,
                ),
            )
        self.extra: tuple[Informer, ...] = ()
        if budgets is not None:
            self.extra = (
                Informer(
                    Resource(rest, "/apis/policy/v1/poddisruptionbudgets"),
                    name="poddisruptionbudgets",
                    handler=budgets,
                    keep=identity,
                ),
            )

    def start(self) -> None:
        for informer in (*self.informers, *self.extra):
            informer.start()

    def stop(self) -> None:
        for informer in (*self.informers, *self.extra):
            informer.stop()

    def ready(self) -> bool:
        """Every watch has listed, and none has been blind for BLIND_LIMIT_SECONDS."""
        return all(
            informer.synced.is_set() and informer.blind_for() < BLIND_LIMIT_SECONDS
            for informer in self.informers
        )

    def unsynced(self) -> list[str]:
        return [i.name for i in self.informers if not i.synced.is_set()]
