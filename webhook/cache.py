"""What admission reads from the cluster, kept in memory by watches.

- Namespaces: only their labels (``headroom.dev/policy`` picks the policy).
- GPUSharingPolicies: parsed once when they change, so admission never
  validates a policy. An object that fails validation is logged, listed in
  :attr:`ClusterCache.invalid_policies` and treated as missing (never half
  applied, never an older version silently kept).
- Nodes labelled ``nvidia.com/mig.capable=true`` (optional): the MIG profiles
  the cluster offers, recomputed only when a node's MIG capacity or labels change.

The ``on_*`` handlers are the informers' callbacks; unit tests feed them
directly, with no apiserver.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from headroom import names
from headroom.mig import MigOffer
from headroom.policy import GPUSharingPolicy, PolicyError, parse_policy
from kube.informer import Informer, Resource, identity
from kube.rest import Rest

log = logging.getLogger(__name__)

MIG_NODE_SELECTOR = f"{names.LABEL_MIG_CAPABLE}=true"
"""Only MIG-capable nodes matter for the offer; the selector keeps the rest out of memory."""
NAMESPACE_READ_TIMEOUT = 2.0
"""Seconds for the one GET that covers a namespace newer than the watch;
well inside the apiserver's default webhook timeout of 10 s."""
NAMESPACE_MISS_SECONDS = 5.0
"""How long a namespace that could not be read is not asked for again. Short:
a namespace created a moment later must not wait long for its first pod."""
MISSES_KEPT = 1024
"""Past this many remembered misses, the expired ones are dropped: reviews naming
a new made-up namespace each (a client other than the apiserver) grew them for good."""

Object = dict[str, Any]


class ClusterCache:
    def __init__(
        self, *, watch_nodes: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.watch_nodes = watch_nodes
        self._labels: dict[str, dict[str, str]] = {}
        self._fetched: dict[str, dict[str, str]] = {}
        self._lookups: dict[str, asyncio.Future[Mapping[str, str]]] = {}
        self._misses: dict[str, float] = {}
        """Namespace -> when a GET of it last failed (monotonic)."""
        self._clock = clock
        self._policies: dict[str, GPUSharingPolicy] = {}
        self._invalid: dict[str, str] = {}
        self._mig_nodes: dict[str, Object] = {}
        self._offer: MigOffer | None = None
        self._informers: list[Informer] = []
        self._rest: Rest | None = None

    # --- what admission reads ---------------------------------------------

    @property
    def policies(self) -> Mapping[str, GPUSharingPolicy]:
        return self._policies

    @property
    def invalid_policies(self) -> Mapping[str, str]:
        return self._invalid

    def mig_offer(self) -> MigOffer | None:
        if not self.watch_nodes:
            return None  # decide() falls back to the built-in profile table
        if self._offer is None:
            self._offer = MigOffer.from_nodes(self._mig_nodes.values())
        return self._offer

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        """The namespace's labels, or None if the watch has not seen it (yet)."""
        labels = self._labels.get(name)
        return labels if labels is not None else self._fetched.get(name)

    async def labels_for(self, name: str) -> Mapping[str, str]:
        """Labels, reading the namespace once if it is newer than the watch.

        A namespace created (or labelled) a moment before its first pod may not
        have reached the watch; reading it beats mutating (or not) by a guess. Raises
        :class:`LookupError` when it cannot be read, so the pod is denied and
        retried rather than let through unmutated.

        Concurrent admissions for one unknown namespace share one GET, and a
        namespace that could not be read is not asked for again for
        :data:`NAMESPACE_MISS_SECONDS`: a flood of pods naming a namespace the
        apiserver does not know costs one GET per period, not one per pod.
        The error's own text stays in the log: an apiserver error can carry
        headers and bodies that are not the pod's author's to read.
        """
        labels = self.namespace_labels(name)
        if labels is not None and names.LABEL_POLICY in labels:
            return labels
        if labels is not None and self._rest is None:
            return labels
        # Unknown, or known without the policy label: the apiserver calls this webhook
        # only for namespaces that carry it (namespaceSelector Exists), so the watch
        # lags a label just set; read it rather than let the pod through unmutated.
        if self._rest is None:
            raise LookupError(f"namespace {name} is not known to the headroom webhook yet")
        missed = self._misses.get(name)
        if missed is not None and self._clock() - missed < NAMESPACE_MISS_SECONDS:
            raise LookupError(_unreadable(name))
        lookup = self._lookups.get(name)
        if lookup is None:
            lookup = asyncio.ensure_future(self._read_namespace(name))
            self._lookups[name] = lookup
            lookup.add_done_callback(lambda _: self._lookups.pop(name, None))
        return await asyncio.shield(lookup)

    async def _read_namespace(self, name: str) -> Mapping[str, str]:
        assert self._rest is not None
        try:
            path = f"/api/v1/namespaces/{quote(name, safe='')}"
            answer = await self._rest.request("GET", path, time_limit=NAMESPACE_READ_TIMEOUT)
            if answer.status != 200:
                raise LookupError(f"HTTP {answer.status}: {answer.message()}")
            namespace = answer.json()
        except Exception as err:
            log.warning("namespace %s: cannot read its labels: %s", name, err)
            if name not in self._labels:
                now = self._clock()
                if len(self._misses) >= MISSES_KEPT:
                    self._misses = {
                        n: t for n, t in self._misses.items() if now - t < NAMESPACE_MISS_SECONDS
                    }
                self._misses[name] = now
            raise LookupError(_unreadable(name)) from err
        fetched = _labels_of(namespace if isinstance(namespace, dict) else {})
        if name not in self._labels:
            self._fetched[name] = fetched
        self._misses.pop(name, None)
        return fetched

    async def wait_synced(self) -> None:
        await asyncio.gather(*(informer.synced.wait() for informer in self._informers))

    def not_synced(self) -> list[str]:
        return [informer.name for informer in self._informers if not informer.synced.is_set()]

    # --- informer callbacks (on the event loop) ---------------------------

    def on_namespace(self, kind: str, obj: Object) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        self._fetched.pop(name, None)
        self._misses.pop(name, None)
        if kind == "DELETED":
            self._labels.pop(name, None)
        else:
            self._labels[name] = _labels_of(obj)

    def on_policy(self, kind: str, obj: Object) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if kind == "DELETED":
            self._policies.pop(name, None)
            self._invalid.pop(name, None)
            return
        try:
            policy = parse_policy(obj)
        except PolicyError as err:
            # The CRD schema should have refused it; an older CRD or a schema
            # gap let it through. Treat it as missing, and say so loudly.
            log.warning("GPUSharingPolicy %s is invalid and ignored: %s", name, err)
            self._policies.pop(name, None)
            self._invalid[name] = str(err).removeprefix(f"{names.POLICY_KIND} {name!r}: ")
            return
        self._invalid.pop(name, None)
        if name not in self._policies:
            log.info("GPUSharingPolicy %s loaded (mode %s)", name, policy.spec.mode)
        self._policies[name] = policy

    def on_node(self, kind: str, obj: Object) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        before = self._mig_nodes.get(name)
        after = None if kind == "DELETED" else _mig_part(obj)
        if after:
            self._mig_nodes[name] = after
        else:
            self._mig_nodes.pop(name, None)
        if before != (after or None):
            self._offer = None  # recomputed on the next admission that needs it

    # --- wiring -----------------------------------------------------------

    def start(self, rest: Rest) -> None:
        """Start the watches (on the running loop); ``not_synced`` reports progress.

        ``rest`` also reads the namespaces newer than the watch.
        """
        self._rest = rest
        policies = f"/apis/{names.GROUP}/{names.VERSION}/{names.POLICY_PLURAL}"
        self._informers = [
            Informer(
                Resource(rest, "/api/v1/namespaces"),
                name="namespaces",
                handler=self.on_namespace,
                keep=identity,
            ),
            Informer(
                Resource(rest, policies),
                name="gpusharingpolicies",
                handler=self.on_policy,
                keep=identity,
            ),
        ]
        if self.watch_nodes:
            self._informers.append(
                Informer(
                    Resource(rest, "/api/v1/nodes", labelSelector=MIG_NODE_SELECTOR),
                    name="nodes",
                    handler=self.on_node,
                    keep=identity,
                )
            )
        for informer in self._informers:
            informer.start()

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()


def _unreadable(name: str) -> str:
    return f"namespace {name}: the headroom webhook cannot read its labels yet; retry"


def _labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): v for k, v in labels.items() if isinstance(v, str)}


def _mig_part(node: Object) -> Object | None:
    """The node reduced to what :meth:`MigOffer.from_nodes` reads, or None if no MIG."""
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    capacity = (node.get("status") or {}).get("capacity") or {}
    mig_capacity = {
        k: v for k, v in capacity.items() if isinstance(k, str) and k.startswith(names.MIG_PREFIX)
    }
    if not mig_capacity:
        return None
    mig_labels = {
        k: v for k, v in labels.items() if isinstance(k, str) and k.startswith(names.MIG_PREFIX)
    }
    return {
        "metadata": {"name": metadata.get("name"), "labels": mig_labels},
        "status": {"capacity": mig_capacity},
    }
