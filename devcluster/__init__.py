"""A real Kubernetes control plane on 127.0.0.1, with fake GPU nodes, for the demo and e2e.

No Docker: etcd, kube-apiserver, kube-controller-manager, two kube-schedulers
(the stock ``default-scheduler`` and ``headroom-scheduler`` with the extender)
and kwok run as background processes built from source by
``tests/e2e/controlplane/build.sh``. Headroom runs on top: CRDs and example
policies, the webhook (registered by URL with its caBundle), the extender and
one simulated agent per GPU node, each with the ServiceAccount and RBAC that
``manifests/base`` gives it in a real cluster.

The API (everything else is internal)::

    from devcluster import cluster

    c = cluster.up(nodes=None, state_dir=None)   # -> Cluster; idempotent if already up
    c.kubeconfig                                  # Path of the admin kubeconfig
    c.kubectl("get", "nodes", "-o", "json")       # the built kubectl -> CompletedProcess
    c.kubectl_json("get", "pods", "-n", "ns")     # parsed JSON
    c.apply(objects)                              # server-side apply of dicts (admin)
    c.stop("extender"); c.start("extender")       # one component (see c.components)
    c.restart("webhook")                          # stop + start + wait ready
    c.components                                  # {"etcd": Component(pid, log, ...), ...}
    c.ports, c.gpu_nodes, c.server                # {"apiserver": 34567, ...}, names, URL
    cluster.attach(state_dir) -> Cluster          # the cluster another process started
    cluster.status(state_dir) -> Status           # what runs, what died (Status.up)
    cluster.down(state_dir)                       # kill everything, remove the state dir

``nodes`` is ``None`` for the default nodes (:mod:`devcluster.nodes`) or a
path to a YAML file in the same format. ``state_dir`` defaults to
``$HEADROOM_STATE`` or ``~/.local/state/headroom/cluster``. ``up`` takes a
``progress`` callable (default: print to stderr) and ``headroom=False`` for a
bare control plane (no Headroom components); ``real_node=True`` (root) adds the real
node ``gpu-real-0`` (:mod:`devcluster.realnode`: kubelet, containerd, runc, the test
device plugin) and then installs Headroom in the cluster from
``manifests/overlays/realnode`` (:mod:`devcluster.incluster`). Errors are
:class:`devcluster.process.ProcessError` (a component died: its name and the
tail of its log) and :class:`devcluster.binaries.BinariesMissing`.
"""
