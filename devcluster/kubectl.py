"""The built kubectl, bound to one kubeconfig: how devcluster and the e2e tests talk
to the cluster, so that what they see (warnings, errors) is what a user sees."""

import json
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

FIELD_MANAGER = "headroom-devcluster"


class KubectlError(RuntimeError):
    def __init__(self, args: list[str], result: subprocess.CompletedProcess[str]) -> None:
        self.result = result
        super().__init__(
            f"kubectl {' '.join(args)} failed ({result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )


class Kubectl:
    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl ARGS``; raise :class:`KubectlError` on failure unless ``check=False``."""
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(list(args), result)
        return result

    def json(self, *args: str) -> Any:
        """``kubectl ARGS -o json``, parsed."""
        return json.loads(self(*args, "-o", "json").stdout)

    def apply(
        self, objects: Iterable[dict[str, Any]], *, dry_run: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Server-side apply of ``objects`` (one call), taking ownership of conflicts."""
        documents = list(objects)
        if not documents:
            return subprocess.CompletedProcess([], 0, "", "")
        args = ["apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}"]
        if dry_run:
            args.append("--dry-run=server")
        return self(*args, "-f", "-", input=yaml.safe_dump_all(documents, sort_keys=False))

    def kustomize(self, directory: Path) -> list[dict[str, Any]]:
        """The objects ``kubectl kustomize DIR`` renders."""
        rendered = self("kustomize", str(directory)).stdout
        return [doc for doc in yaml.safe_load_all(rendered) if doc]


def wait_until(
    description: str, ready: Callable[[], bool], *, timeout: float, interval: float = 0.5
) -> None:
    """Poll ``ready()`` until true; on timeout raise TimeoutError naming ``description``."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {description}")
        time.sleep(interval)
