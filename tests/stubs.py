"""The check that generated gRPC stubs are what their vendored proto gives today."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUBS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def stale_stubs(proto: str, out: Path) -> list[str]:
    """Rerun protoc on ``proto`` (relative to the repo) into ``out``, as the Makefile's
    target does, and name each committed stub that differs from the fresh one."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(REPO / proto),
        ],
        check=True,
        cwd=REPO,
    )
    package = Path(proto).parent
    return [
        str(package / name)
        for name in STUBS
        if (out / package / name).read_text() != (REPO / package / name).read_text()
    ]
