"""The Kubernetes processes of the local cluster and their configuration.

Everything listens on 127.0.0.1 on ports picked at ``up`` and kept in the state.
The apiserver authorizes with ``Node,RBAC`` and runs the mutating and validating
webhook admission plugins, so Headroom meets the same checks as in a real
cluster; each process has its own identity (a client certificate).
"""

import shutil
from pathlib import Path
from typing import Any

import yaml

from devcluster import kubeconfig, pki
from devcluster.nodes import KWOK_ANNOTATION
from devcluster.process import Component, Probe
from devcluster.state import ClusterState

STAGES = Path(__file__).parent / "data" / "kwok-stages.yaml"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.0.0.0/16"
ADMISSION_PLUGINS = (
    "NamespaceLifecycle,LimitRanger,ServiceAccount,NodeRestriction,TaintNodesByCondition,"
    "PodSecurity,Priority,DefaultTolerationSeconds,RuntimeClass,ResourceQuota,"
    "MutatingAdmissionWebhook,ValidatingAdmissionPolicy,ValidatingAdmissionWebhook"
)
# The stock client rate limits (20 qps) make a 100-pod burst take seconds per hop.
CLIENT_QPS = 200
CLIENT_BURST = 400


def identity(state: ClusterState, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
    """A client certificate for ``user`` and a kubeconfig that uses it."""
    authority = pki.Authority(state.pki)
    pair = authority.issue(name, common_name=user, groups=groups)
    return kubeconfig.write(
        state.kubeconfigs / f"{name}.kubeconfig",
        server=state.server,
        ca=authority.cert_path,
        user=user,
        cert=pair.cert,
        key=pair.key,
    )


def prepare_pki(state: ClusterState) -> None:
    """CA, apiserver serving cert, service-account keys and the admin kubeconfig."""
    authority = pki.Authority(state.pki)
    authority.issue(
        "apiserver",
        common_name="kube-apiserver",
        dns_names=pki.APISERVER_SANS,
        ip_addresses=pki.APISERVER_IPS,
    )
    pki.service_account_keys(state.pki)
    # The apiserver's client identity towards kubelets (logs, exec, port-forward).
    authority.issue(
        "apiserver-kubelet-client",
        common_name="kube-apiserver-kubelet-client",
        groups=("system:masters",),
    )
    identity(state, "admin", "headroom-admin", ("system:masters",))


def etcd(state: ClusterState, bins: Path) -> Component:
    client = f"http://127.0.0.1:{state.port('etcd')}"
    peer = f"http://127.0.0.1:{state.port('etcd-peer')}"
    return Component(
        name="etcd",
        argv=[
            str(bins / "etcd"),
            "--name=headroom",
            f"--data-dir={state.directory / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=headroom={peer}",
            # A throwaway cluster: durability is not worth an fsync per write.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ],
        log=str(state.logs / "etcd.log"),
        probe=Probe(f"{client}/health"),
    )


def apiserver(state: ClusterState, bins: Path) -> Component:
    pkidir = state.pki
    return Component(
        name="kube-apiserver",
        argv=[
            str(bins / "kube-apiserver"),
            "--advertise-address=127.0.0.1",
            "--bind-address=127.0.0.1",
            f"--secure-port={state.port('apiserver')}",
            f"--etcd-servers=http://127.0.0.1:{state.port('etcd')}",
            f"--tls-cert-file={pkidir / 'apiserver.crt'}",
            f"--tls-private-key-file={pkidir / 'apiserver.key'}",
            f"--client-ca-file={pkidir / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pkidir / 'sa.pub'}",
            f"--service-account-signing-key-file={pkidir / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            f"--enable-admission-plugins={ADMISSION_PLUGINS}",
            "--allow-privileged=true",
            f"--kubelet-client-certificate={pkidir / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pkidir / 'apiserver-kubelet-client.key'}",
            # A kubelet's hostname (gpu-real-0) resolves nowhere; its InternalIP does.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            # Webhooks and aggregated APIs are called at their endpoints' pod IPs (on
            # the real node's bridge), as there is no kube-proxy to route a ClusterIP.
            "--enable-aggregator-routing=true",
            "--profiling=false",
        ],
        log=str(state.logs / "kube-apiserver.log"),
        probe=Probe(
            f"{state.server}/readyz",
            ca=str(pkidir / "ca.crt"),
            cert=str(pkidir / "admin.crt"),
            key=str(pkidir / "admin.key"),
        ),
    )


def controller_manager(state: ClusterState, bins: Path) -> Component:
    config = identity(state, "controller-manager", "system:kube-controller-manager")
    port = state.port("controller-manager")
    return Component(
        name="kube-controller-manager",
        argv=[
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={config}",
            f"--authentication-kubeconfig={config}",
            f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={state.config / 'controller-manager'}",
            "--leader-elect=true",
            # Each controller acts as its own service account, as in kubeadm clusters.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={state.pki / 'sa.key'}",
            f"--root-ca-file={state.pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={state.pki / 'ca.crt'}",
            f"--cluster-signing-key-file={state.pki / 'ca.key'}",
            f"--kube-api-qps={CLIENT_QPS}",
            f"--kube-api-burst={CLIENT_BURST}",
            "--profiling=false",
        ],
        log=str(state.logs / "kube-controller-manager.log"),
        probe=Probe(f"https://127.0.0.1:{port}/healthz"),
    )


def scheduler_configuration(
    config: Path,
    *,
    scheduler_name: str,
    lease: tuple[str, str],
    extender: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``kubescheduler.config.k8s.io/v1`` KubeSchedulerConfiguration with one profile."""
    namespace, name = lease
    document: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(config), "qps": CLIENT_QPS, "burst": CLIENT_BURST},
        "leaderElection": {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceNamespace": namespace,
            "resourceName": name,
        },
        "profiles": [{"schedulerName": scheduler_name}],
    }
    if extender is not None:
        document["extenders"] = [extender]
    return document


def scheduler(
    state: ClusterState,
    bins: Path,
    *,
    name: str,
    config: Path,
    configuration: dict[str, Any],
) -> Component:
    path = state.config / f"{name}.yaml"
    path.write_text(yaml.safe_dump(configuration, sort_keys=False))
    port = state.port(name)
    return Component(
        name=name,
        argv=[
            str(bins / "kube-scheduler"),
            f"--config={path}",
            f"--authentication-kubeconfig={config}",
            f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={state.config / name}",
        ],
        log=str(state.logs / f"{name}.log"),
        probe=Probe(f"https://127.0.0.1:{port}/healthz"),
    )


def default_scheduler(state: ClusterState, bins: Path) -> Component:
    config = identity(state, "kube-scheduler", "system:kube-scheduler")
    configuration = scheduler_configuration(
        config, scheduler_name="default-scheduler", lease=("kube-system", "kube-scheduler")
    )
    return scheduler(state, bins, name="kube-scheduler", config=config, configuration=configuration)


def kwok(state: ClusterState, bins: Path) -> Component:
    # kwok plays every kubelet: it writes node and pod status, node leases and
    # deletes pods, so it gets a cluster-admin identity rather than a node's.
    config = identity(state, "kwok", "kwok-controller", ("system:masters",))
    stages = state.config / "kwok-stages.yaml"
    shutil.copyfile(STAGES, stages)
    port = state.port("kwok")
    return Component(
        name="kwok",
        argv=[
            str(bins / "kwok"),
            f"--kubeconfig={config}",
            f"--config={stages}",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--server-address=127.0.0.1:{port}",
            f"--cidr={POD_CIDR}",
            "--node-lease-duration-seconds=40",
        ],
        log=str(state.logs / "kwok.log"),
        probe=Probe(f"http://127.0.0.1:{port}/healthz"),
    )
