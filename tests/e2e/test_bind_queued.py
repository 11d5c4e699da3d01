"""A binding POST its client gave up on must not be stored after the extender let go.

The extender charges a pod whose binding POST ended without an answer until a read
``verify_after`` (10 s) after the POST began says it is not bound: by then, the
design says, the POST can no longer be stored. kube-apiserver's API Priority and
Fairness, though, queues a request before anything reads its body, and Go's HTTP
server only notices that the client hung up once the body has been read: a
queued POST stays queued after its client's 3 s timeout, for up to a quarter of
the request's deadline (60 s by default: 15 s, getRequestWaitContext in
k8s.io/apiserver pkg/server/filters/priority-and-fairness.go), and is then
executed. Here a priority level with no seats holds the extender's binding POST
queued (an apiserver saturated by a storm), is given seats 12 s later, and the
binding must not land after the extender's read released the pod.

Without the request's own deadline the binding landed after the release in 2 of
6 runs here: once dispatched, the handler races Go's server noticing the client
gone (which cancels the request's context) to the etcd write. With it, the
queued POST is refused (429) within a quarter of the 3 s, before the client's
timeout, so the extender lets go of nothing it may yet see bound.
"""

import asyncio
import dataclasses
import time
from typing import Any

import yaml

from devcluster.cluster import Cluster
from extender.binding import ApiCalls, api_binder, api_reader
from extender.state import ClusterState
from extender.verbs import Extender
from extender.wire import ExtenderBindingArgs
from kube.config import credentials
from tests.e2e.conftest import NamespaceFactory
from tests.e2e.workloads import eventually, gpu_pod
from tests.extender.objects import gpu_node

NOWHERE = "e2e-no-such-node"
VERIFY_AFTER = 10.0


def level(name: str, shares: int) -> dict[str, Any]:
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": name},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": shares,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {
                    "type": "Queue",
                    "queuing": {"queues": 1, "handSize": 1, "queueLengthLimit": 16},
                },
            },
        },
    }


def schema(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": name},
            "matchingPrecedence": 50,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "serviceAccount": {"name": "binder", "namespace": namespace},
                        }
                    ],
                    "resourceRules": [
                        {
                            "verbs": ["create"],
                            "apiGroups": [""],
                            "resources": ["pods/binding"],
                            "namespaces": [namespace],
                        }
                    ],
                }
            ],
        },
    }


def made_level(namespace: str) -> str:
    return f"e2e-held-{namespace}"


def test_a_binding_post_queued_past_its_timeout_does_not_land_after_the_release(
    cluster: Cluster, namespace: NamespaceFactory
) -> None:
    ns = namespace("gpu-shared")
    name = made_level(ns)
    cluster.kubectl("create", "serviceaccount", "binder", "-n", ns)
    cluster.kubectl(
        "create", "role", "binder", "-n", ns, "--verb=get,create",
        "--resource=pods,pods/binding",
    )  # fmt: skip
    cluster.kubectl(
        "create", "rolebinding", "binder", "-n", ns, "--role=binder",
        f"--serviceaccount={ns}:binder",
    )  # fmt: skip
    token = cluster.kubectl("create", "token", "binder", "-n", ns).stdout.strip()
    cluster.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump_all([level(name, 0), schema(name, ns)])
    )
    try:
        pod = gpu_pod(ns, "held", memory="10Gi")
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NOWHERE}  # no scheduler binds it
        cluster.apply([pod])
        made = cluster.kubectl_json("get", "pod", "held", "-n", ns)
        eventually(
            "APF taking up the FlowSchema",
            lambda: any(
                c.get("type") == "Dangling" and c.get("status") == "False"
                for c in cluster.kubectl_json("get", "flowschema", name)
                .get("status", {})
                .get("conditions", [])
            ),
            timeout=30,
        )
        time.sleep(1)
        outcome = asyncio.run(_bind_then_verify(cluster, ns, token, made))
        released, answer = outcome
        # The FlowSchema held the POST: it was not stored while the client waited.
        assert answer, "bound at once: the priority level with no seats did not hold the POST"
        deadline = time.monotonic() + 20
        landed = ""
        while time.monotonic() < deadline and not landed:
            landed = cluster.kubectl_json("get", "pod", "held", "-n", ns)["spec"].get(
                "nodeName", ""
            )
            time.sleep(0.5)
        assert not (released and landed), (
            f"bind answered {answer!r}; the extender released the pod {VERIFY_AFTER:.0f}s "
            f"after the POST began (a read said unbound), then the POST was stored "
            f"(nodeName {landed})"
        )
    finally:
        cluster.kubectl("delete", "flowschema,prioritylevelconfiguration", name, check=False)


async def _bind_then_verify(
    cluster: Cluster, ns: str, token: str, made: dict[str, Any]
) -> tuple[int, str]:
    admin = credentials(str(cluster.kubeconfig))
    as_binder = dataclasses.replace(
        admin,
        cert_file=None,
        key_file=None,
        cert_data=None,
        key_data=None,
        authorization=lambda: f"Bearer {token}",
    )
    calls = ApiCalls(as_binder)
    try:
        state = ClusterState(margin=2**29, stale_after=90.0, verify_after=VERIFY_AFTER)
        state.on_node("ADDED", gpu_node(NOWHERE))
        state.on_pod("ADDED", made)
        extender = Extender(state, api_binder(calls), reader=api_reader(calls))
        began = time.monotonic()
        answer = await extender.bind(
            ExtenderBindingArgs(
                PodName="held", PodNamespace=ns, PodUID=made["metadata"]["uid"], Node=NOWHERE
            )
        )
        await asyncio.sleep(max(0.0, began + VERIFY_AFTER + 0.5 - time.monotonic()))
        released = await extender.verify_due()
        # The extender has let go of the pod (or never held it past a definite refusal):
        # now the priority level gets seats again, while a POST queued at the start
        # would still be waiting (15 s).
        level_with_seats = yaml.safe_dump(level(made_level(ns), 10))
        await asyncio.to_thread(cluster.kubectl, "apply", "-f", "-", input=level_with_seats)
        return released, answer.Error
    finally:
        await calls.close()
