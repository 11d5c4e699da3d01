"""Kubeconfig files for the local cluster: one per identity, all pointing at 127.0.0.1."""

import base64
from pathlib import Path

import yaml


def write(
    path: Path,
    *,
    server: str,
    ca: Path,
    user: str,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> Path:
    """A kubeconfig with one cluster, one user (client cert or bearer token), one context."""
    credentials: dict[str, str] = {}
    if cert and key:
        credentials["client-certificate"] = str(cert)
        credentials["client-key"] = str(key)
    if token:
        credentials["token"] = token
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "headroom",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "headroom", "context": {"cluster": "headroom", "user": user}}],
        "current-context": "headroom",
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    path.chmod(0o600)
    return path
