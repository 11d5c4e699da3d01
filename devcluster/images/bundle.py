"""Running a command in an image archive as the manifests run it, with no daemon.

umoci unpacks the archive into an OCI runtime bundle (root filesystem plus the
``config.json`` the image's config implies); runc runs it as the given uid, on a
read-only root filesystem, with every capability dropped -- what
``runAsUser``, ``readOnlyRootFilesystem`` and ``capabilities: drop: [ALL]`` ask
of kubelet.
"""

import itertools
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster.images.tools import ImageError, output

_ids = itertools.count(1)


@dataclass(frozen=True)
class Bundle:
    path: Path
    config: dict[str, Any]  # the image's config as umoci rendered it (process.user, .env ...)

    @classmethod
    def unpack(cls, archive: Path, ref: str, work: Path) -> "Bundle":
        """``work`` receives the layout and the bundle (as root: files keep their owners)."""
        layout, path = work / "layout", work / "bundle"
        with tarfile.open(archive) as tar:
            tar.extractall(layout, filter="data")
        output(["umoci", "unpack", "--image", f"{layout}:{ref}", path])
        return cls(path, json.loads((path / "config.json").read_text()))

    def run(
        self, *args: str, uid: int = 10001, gid: int = 10001, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """``args`` in a fresh container (no terminal, loopback-only network)."""
        config = json.loads(json.dumps(self.config))
        process = config["process"]
        process.update(terminal=False, args=list(args), user={"uid": uid, "gid": gid})
        process["capabilities"] = {kind: [] for kind in process.get("capabilities", {})}
        process["noNewPrivileges"] = True
        config["root"]["readonly"] = True
        (self.path / "config.json").write_text(json.dumps(config))
        name = f"headroom-image-check-{os.getpid()}-{next(_ids)}"
        # A runc state root of our own: nothing else's containers are listed or touched.
        state = self.path.parent / "runc"
        try:
            return subprocess.run(
                ["runc", "--root", str(state), "run", "--bundle", str(self.path), name],
                capture_output=True, text=True, timeout=timeout, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired as error:
            subprocess.run(
                ["runc", "--root", str(state), "delete", "--force", name],
                capture_output=True, check=False,
            )  # fmt: skip
            raise ImageError(f"{' '.join(args)} did not exit in {timeout}s") from error
