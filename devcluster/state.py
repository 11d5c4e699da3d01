"""The state directory of one local cluster, and the ``state.json`` that describes it.

Layout under the state dir (default ``$HEADROOM_STATE`` or
``~/.local/state/headroom/cluster``)::

    state.json        ports, components (argv, pid, log, probe), node names
    pki/              cluster CA, apiserver serving cert, client certs, SA keys
    kubeconfigs/      admin.kubeconfig and one per component identity
    config/           scheduler configurations, kwok stages, rendered manifests
    etcd/             etcd's data
    webhook-certs/    the webhook's serving cert (``headroom certs generate``)
    logs/<name>.log   one per component
"""

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster.process import Component

STATE_FILE = "state.json"


def default_state_dir() -> Path:
    configured = os.environ.get("HEADROOM_STATE")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".local" / "state" / "headroom" / "cluster"


def free_port() -> int:
    """A port nothing listens on now. Another process may take it before we bind it;
    the component then fails to start and says so in its log."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class ClusterState:
    directory: Path
    ports: dict[str, int] = field(default_factory=dict)
    components: dict[str, Component] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    gpu_nodes: list[str] = field(default_factory=list)

    @property
    def pki(self) -> Path:
        return self.directory / "pki"

    @property
    def kubeconfigs(self) -> Path:
        return self.directory / "kubeconfigs"

    @property
    def config(self) -> Path:
        return self.directory / "config"

    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfigs / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port('apiserver')}"

    def port(self, name: str) -> int:
        """The port named ``name``, allocated on first use and kept in the state."""
        if name not in self.ports:
            taken = set(self.ports.values())
            port = free_port()
            while port in taken:
                port = free_port()
            self.ports[name] = port
        return self.ports[name]

    def make_dirs(self) -> None:
        for directory in (self.pki, self.kubeconfigs, self.config, self.logs):
            directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)

    def save(self) -> None:
        document = {
            "ports": self.ports,
            "components": {name: c.to_json() for name, c in self.components.items()},
            "nodes": self.nodes,
            "gpuNodes": self.gpu_nodes,
        }
        temporary = self.directory / f"{STATE_FILE}.tmp"
        temporary.write_text(json.dumps(document, indent=2))
        temporary.replace(self.directory / STATE_FILE)

    @classmethod
    def load(cls, directory: Path) -> "ClusterState | None":
        """The saved state, or None when no cluster was ever started here."""
        try:
            document: dict[str, Any] = json.loads((directory / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        return cls(
            directory=directory,
            ports={k: int(v) for k, v in document.get("ports", {}).items()},
            components={
                name: Component.from_json(data)
                for name, data in document.get("components", {}).items()
            },
            nodes=list(document.get("nodes", [])),
            gpu_nodes=list(document.get("gpuNodes", [])),
        )
