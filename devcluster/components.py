"""Headroom on the local cluster: manifests, certificates, and its processes.

``install`` renders ``manifests/overlays/local`` (the base without anything
that needs a container image, and the webhook registered by URL) and applies
it server-side: namespace and CRDs first, then RBAC and the example policies.
It generates the webhook's certificates with ``headroom certs generate``,
starts the webhook, the extender, the ``headroom-scheduler`` (a second
kube-scheduler whose KubeSchedulerConfiguration names the extender) and one
simulated agent per GPU node, and only then registers the webhook (its URL and
caBundle filled in), so no pod is ever sent to a webhook that is not up.

Each process authenticates as its ServiceAccount's user (a client certificate
with that name and groups), so the RBAC in ``manifests/base/rbac`` is what
authorizes it, as in a real cluster.
"""

import base64
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devcluster import controlplane, kubeconfig, nodes
from devcluster.binaries import CHECKOUT
from devcluster.process import Component, Probe, ProcessError, Progress
from devcluster.state import ClusterState
from headroom import names

if TYPE_CHECKING:
    from devcluster.cluster import Cluster

NAMESPACE = "headroom-system"
LOCAL_OVERLAY = CHECKOUT / "manifests" / "overlays" / "local"
WEBHOOK_CONFIGURATION = "headroom"
WEBHOOK_SERVICE = "headroom-webhook"
REPORT_TIMEOUT = 60.0
EXTENDER_WEIGHT = 5
"""The extender's score (0..10) counts ``score x weight x 10``: 5 lets binpack or
spread outweigh the in-tree spreading scores, which differ little between nodes."""
AGENT_INTERVAL = "2s"

SERVICE_ACCOUNTS = {
    "webhook": "headroom-webhook",
    "scheduler": "headroom-scheduler",
    "agent": "headroom-agent",
}
"""Component -> its ServiceAccount in ``manifests/base/rbac`` (the extender runs in the
scheduler's pod, so it shares that ServiceAccount)."""


def _headroom(*args: str) -> list[str]:
    # `python -m cli` rather than the console script: the script is a shebang file,
    # and /proc/PID/cmdline of a shebang file starts with the interpreter anyway.
    return [sys.executable, "-m", "cli", *args]


def _account(state: ClusterState, component: str) -> Path:
    account = SERVICE_ACCOUNTS[component]
    return controlplane.identity(
        state,
        account,
        f"system:serviceaccount:{NAMESPACE}:{account}",
        ("system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"),
    )


AGENT_TOKEN_DURATION = "48h"
"""Node-bound agent tokens are not refreshed on the local cluster; a test session or
a demo lasts minutes. (In a real cluster the DaemonSet's projected token is.)"""


def _agent_account(cluster: "Cluster", node: str) -> Path:
    """A kubeconfig with a headroom-agent token bound to ``node``'s Node object.

    Such a token carries ``authentication.kubernetes.io/node-name``, which the
    ValidatingAdmissionPolicy ``headroom-agent-own-node`` checks against the
    GPUNodeReport written; a client certificate carries no such claim.
    """
    account = SERVICE_ACCOUNTS["agent"]
    token = cluster.kubectl(
        "create", "token", account, "-n", NAMESPACE,
        "--bound-object-kind", "Node", "--bound-object-name", node,
        f"--duration={AGENT_TOKEN_DURATION}",
    ).stdout.strip()  # fmt: skip
    state = cluster.state
    return kubeconfig.write(
        state.kubeconfigs / f"agent-{node}.kubeconfig",
        server=state.server,
        ca=state.pki / "ca.crt",
        user=f"system:serviceaccount:{NAMESPACE}:{account}",
        token=token,
    )


def extender_configuration(port: int, specs: list[nodes.NodeSpec]) -> dict[str, Any]:
    """The ``extenders[0]`` entry of the headroom-scheduler's configuration."""
    managed = [names.GPU_SHARED, *nodes.mig_resources(specs)]
    return {
        "urlPrefix": f"http://127.0.0.1:{port}",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "preemptVerb": "preempt",
        "weight": EXTENDER_WEIGHT,
        "enableHTTPS": False,
        "nodeCacheCapable": True,
        "managedResources": [{"name": name, "ignoredByScheduler": False} for name in managed],
        # Not ignorable: without the extender a shared pod must wait, not be over-committed.
        "ignorable": False,
        "httpTimeout": "5s",
    }


def _processes(cluster: "Cluster", specs: list[nodes.NodeSpec]) -> list[Component]:
    state, bins = cluster.state, cluster.bins
    certs = state.directory / "webhook-certs"
    webhook_port = state.port("webhook")
    extender_port = state.port("extender")
    webhook_config = _account(state, "webhook")
    scheduler_config = _account(state, "scheduler")
    processes = [
        Component(
            name="webhook",
            argv=_headroom(
                "webhook",
                "--cert-dir",
                str(certs),
                "--host",
                "127.0.0.1",
                "--port",
                str(webhook_port),
                "--kubeconfig",
                str(webhook_config),
                "--service",
                WEBHOOK_SERVICE,
                "--service-namespace",
                NAMESPACE,
            ),
            log=str(state.logs / "webhook.log"),
            probe=Probe(f"https://127.0.0.1:{webhook_port}/readyz", ca=str(certs / "ca.crt")),
        ),
        Component(
            name="extender",
            argv=_headroom(
                "extender",
                "--host",
                "127.0.0.1",
                "--port",
                str(extender_port),
                "--kubeconfig",
                str(scheduler_config),
                "--leader-lease",
                f"{NAMESPACE}/headroom-scheduler",
            ),
            log=str(state.logs / "extender.log"),
            probe=Probe(f"http://127.0.0.1:{extender_port}/readyz"),
        ),
        controlplane.scheduler(
            state,
            bins,
            name="headroom-scheduler",
            config=scheduler_config,
            configuration=controlplane.scheduler_configuration(
                scheduler_config,
                scheduler_name="headroom-scheduler",
                lease=(NAMESPACE, "headroom-scheduler"),
                extender=extender_configuration(extender_port, specs),
            ),
        ),
    ]
    for spec in specs:
        if spec.has_gpu():
            processes.append(agent_component(cluster, spec.name))
    return processes


def agent_component(cluster: "Cluster", node: str) -> Component:
    """A simulated node agent for ``node`` (started by ``up`` for every GPU node; tests
    that add a node through the API launch one with ``cluster._launch``)."""
    state = cluster.state
    agent_port = state.port(f"agent-{node}")
    return Component(
        name=f"agent-{node}",
        argv=_headroom(
            "agent",
            "--node-name",
            node,
            "--backend",
            "simulated",
            "--kubeconfig",
            str(_agent_account(cluster, node)),
            "--interval",
            AGENT_INTERVAL,
            "--port",
            str(agent_port),
            "--host",
            "127.0.0.1",
        ),
        log=str(state.logs / f"agent-{node}.log"),
        probe=Probe(f"http://127.0.0.1:{agent_port}/readyz"),
    )


def _generate_certs(state: ClusterState) -> bytes:
    out = state.directory / "webhook-certs"
    result = subprocess.run(
        _headroom(
            "certs",
            "generate",
            "--service",
            WEBHOOK_SERVICE,
            "--namespace",
            NAMESPACE,
            "--ip",
            "127.0.0.1",
            "--out",
            str(out),
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"headroom certs generate failed: {result.stderr.strip()}")
    return (out / "ca.crt").read_bytes()


def register_webhook(
    objects: list[dict[str, Any]], *, port: int, ca_bundle: bytes
) -> list[dict[str, Any]]:
    """The overlay's MutatingWebhookConfiguration(s) with the local URL and caBundle
    (each webhook keeps the path its Service reference names)."""
    registered = []
    for configuration in objects:
        for webhook in configuration.get("webhooks", []):
            path = webhook.get("clientConfig", {}).get("service", {}).get("path", "/mutate")
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
        registered.append(configuration)
    return registered


def install(cluster: "Cluster", specs: list[nodes.NodeSpec], progress: Progress) -> None:
    if not LOCAL_OVERLAY.is_dir():
        raise FileNotFoundError(f"{LOCAL_OVERLAY} not found: run from a Headroom checkout")
    state = cluster.state
    kubectl = cluster.kubectl
    objects = kubectl.kustomize(LOCAL_OVERLAY)
    first = [o for o in objects if o["kind"] in ("Namespace", "CustomResourceDefinition")]
    webhooks = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    rest = [o for o in objects if o not in first and o not in webhooks]
    kubectl.apply(first)
    kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubectl.apply(rest)
    progress(f"applied {LOCAL_OVERLAY.relative_to(CHECKOUT)}: {len(objects)} objects")
    ca_bundle = _generate_certs(state)
    cluster._launch(_processes(cluster, specs), progress)
    kubectl.apply(register_webhook(webhooks, port=state.port("webhook"), ca_bundle=ca_bundle))
    progress(f"webhook registered at https://127.0.0.1:{state.port('webhook')}/mutate")
    _wait_reports(cluster, [spec.name for spec in specs if spec.has_gpu()], progress)


def _wait_reports(cluster: "Cluster", gpu_nodes: list[str], progress: Progress) -> None:
    deadline = time.monotonic() + REPORT_TIMEOUT

    def reported() -> set[str]:
        # A report without GPUs is an agent that has not read its node yet.
        items = cluster.kubectl_json("get", "gpunodereports")["items"]
        return {item["metadata"]["name"] for item in items if item["status"].get("gpus")}

    while not set(gpu_nodes) <= (seen := reported()):
        for name in gpu_nodes:
            agent = cluster.components[f"agent-{name}"]
            if not agent.alive():
                raise ProcessError(
                    f"{agent.name} exited; last lines of {agent.log}:\n{agent.log_tail()}"
                )
        if time.monotonic() > deadline:
            missing = sorted(set(gpu_nodes) - seen)
            raise TimeoutError(f"no GPUNodeReport after {REPORT_TIMEOUT:.0f}s for {missing}")
        time.sleep(0.5)
    progress(f"agents reporting: {len(gpu_nodes)} GPUNodeReports")
