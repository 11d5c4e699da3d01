"""Headroom installed the way a platform team installs it, on the local cluster's real node.

``install`` renders ``manifests/overlays/realnode`` (manifests/base with the local
images, never pulled, and every workload pinned to the real node) and applies it
server-side, then waits for what a user would wait for, in order:

1. the ``headroom-certs`` Job issues the webhook's serving certificate and injects
   the caBundle into the MutatingWebhookConfiguration;
2. the webhook Deployment is available behind its Service (the apiserver calls it
   at the endpoint's pod IP on the node's bridge);
3. the scheduler Deployment (kube-scheduler and the extender sidecar) is available
   and holds its lease;
4. the agent DaemonSet's pod on the real node has written its GPUNodeReport.

The images must be in the node's containerd already (``images.ensure`` builds them,
``realnode.start`` imports every cached archive). When a step times out, the error
carries what ``kubectl describe`` and the pods' logs would show, so a failure reads
as it would in a real cluster.
"""

import base64
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from devcluster.binaries import CHECKOUT
from devcluster.kubectl import KubectlError, wait_until
from devcluster.process import Progress

if TYPE_CHECKING:
    from devcluster.cluster import Cluster

NAMESPACE = "headroom-system"
OVERLAY = CHECKOUT / "manifests" / "overlays" / "realnode"
WEBHOOK_CONFIGURATION = "headroom"
CERTIFICATES_JOB = "headroom-certs"
DEPLOYMENTS = ("headroom-webhook", "headroom-scheduler")
DAEMONSET = "headroom-agent"
STEP_TIMEOUT = 180.0
"""Per step. Cold, the first pod of an image waits for containerd to unpack it."""


class InstallError(RuntimeError):
    """A step of the in-cluster install did not finish; the message says what the
    cluster showed."""


def _ca_injected(cluster: "Cluster") -> bool:
    configuration = cluster.kubectl_json(
        "get", "mutatingwebhookconfiguration", WEBHOOK_CONFIGURATION
    )
    bundles = [
        webhook.get("clientConfig", {}).get("caBundle", "")
        for webhook in configuration.get("webhooks", [])
    ]
    return bool(bundles) and all(
        b"BEGIN CERTIFICATE" in base64.b64decode(bundle) for bundle in bundles
    )


def _job_complete(cluster: "Cluster") -> bool:
    job = cluster.kubectl_json("get", "job", CERTIFICATES_JOB, "-n", NAMESPACE)
    conditions = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}
    if conditions.get("Failed") == "True":
        raise InstallError(f"job {CERTIFICATES_JOB} failed\n{diagnose(cluster)}")
    return conditions.get("Complete") == "True"


def _deployment_available(cluster: "Cluster", name: str) -> bool:
    deployment = cluster.kubectl_json("get", "deployment", name, "-n", NAMESPACE)
    wanted = deployment["spec"].get("replicas", 1)
    status = deployment.get("status", {})
    return bool(
        status.get("observedGeneration", 0) >= deployment["metadata"]["generation"]
        and status.get("availableReplicas", 0) >= wanted
        and status.get("updatedReplicas", 0) >= wanted
    )


def _daemonset_ready(cluster: "Cluster") -> bool:
    daemonset = cluster.kubectl_json("get", "daemonset", DAEMONSET, "-n", NAMESPACE)
    status = daemonset.get("status", {})
    wanted = status.get("desiredNumberScheduled", 0)
    return bool(wanted > 0 and status.get("numberReady", 0) >= wanted)


def _reported(cluster: "Cluster", node: str) -> bool:
    result = cluster.kubectl("get", "gpunodereport", node, "-o", "json", check=False)
    if result.returncode != 0:
        return False
    return bool(json.loads(result.stdout).get("status", {}).get("gpus"))


def _container_state(status: dict[str, Any]) -> str:
    """``name: waiting CrashLoopBackOff``, as ``kubectl get pods`` would summarise it."""
    state: dict[str, dict[str, Any]] = status.get("state") or {}
    for phase, detail in state.items():
        return f"{status['name']}: {phase} {detail.get('reason', '')}".strip()
    return f"{status['name']}: ?"


def diagnose(cluster: "Cluster") -> str:
    """The namespace's pods (phase, waiting reasons), its recent Events, and the last
    log lines of every container that is not ready."""
    lines: list[str] = []
    try:
        pods = cluster.kubectl_json("get", "pods", "-n", NAMESPACE)["items"]
    except KubectlError as err:
        return f"(could not list pods: {err})"
    for pod in pods:
        name = pod["metadata"]["name"]
        status = pod.get("status", {})
        statuses = status.get("containerStatuses", [])
        waiting = [_container_state(s) for s in statuses if not s.get("ready")]
        where = pod.get("spec", {}).get("nodeName", "-")
        lines.append(f"pod {name} on {where}: {status.get('phase')} {'; '.join(waiting)}")
        for container in statuses:
            if container.get("ready"):
                continue
            logs = cluster.kubectl(
                "logs", "-n", NAMESPACE, name, "-c", container["name"], "--tail=15",
                check=False, timeout=20,
            )  # fmt: skip
            text = (logs.stdout or logs.stderr).strip()
            if text:
                lines.append(f"  logs of {container['name']}:")
                lines.extend(f"    {line}" for line in text.splitlines())
    events = cluster.kubectl(
        "get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp",
        "-o", "custom-columns=REASON:.reason,OBJECT:.involvedObject.name,MESSAGE:.message",
        check=False,
    )  # fmt: skip
    tail = events.stdout.strip().splitlines()[-20:]
    if tail:
        lines.append("events:")
        lines.extend(f"  {line}" for line in tail)
    return "\n".join(lines)


def _step(
    cluster: "Cluster",
    progress: Progress,
    description: str,
    ready: Callable[[], bool],
    timeout: float,
) -> None:
    started = time.monotonic()
    try:
        wait_until(description, ready, timeout=timeout, interval=1.0)
    except TimeoutError as err:
        raise InstallError(f"{err}\n{diagnose(cluster)}") from err
    progress(f"{description}: done in {time.monotonic() - started:.1f}s")


def install(
    cluster: "Cluster", node: str, progress: Progress, *, timeout: float = STEP_TIMEOUT
) -> list[dict[str, Any]]:
    """Apply the real-node overlay server-side and wait until Headroom serves from
    ``node``; returns the objects applied."""
    if not OVERLAY.is_dir():
        raise FileNotFoundError(f"{OVERLAY} not found: run from a Headroom checkout")
    kubectl = cluster.kubectl
    objects = kubectl.kustomize(OVERLAY)
    first = [o for o in objects if o["kind"] in ("Namespace", "CustomResourceDefinition")]
    rest = [o for o in objects if o not in first]
    kubectl.apply(first)
    kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubectl.apply(rest)
    progress(f"applied {OVERLAY.relative_to(CHECKOUT)} server-side: {len(objects)} objects")
    _step(
        cluster,
        progress,
        f"job {CERTIFICATES_JOB} to issue the serving certificate",
        lambda: _job_complete(cluster),
        timeout,
    )
    _step(
        cluster,
        progress,
        f"the caBundle of {WEBHOOK_CONFIGURATION}",
        lambda: _ca_injected(cluster),
        timeout,
    )
    for name in DEPLOYMENTS:
        _step(
            cluster,
            progress,
            f"deployment {name} to be available",
            lambda name=name: _deployment_available(cluster, name),  # type: ignore[misc]
            timeout,
        )
    _step(
        cluster,
        progress,
        f"daemonset {DAEMONSET} to be ready",
        lambda: _daemonset_ready(cluster),
        timeout,
    )
    _step(
        cluster,
        progress,
        f"the agent's GPUNodeReport for {node}",
        lambda: _reported(cluster, node),
        timeout,
    )
    return objects
