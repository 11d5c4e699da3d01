"""The NVML backend against a real NVIDIA driver: run only where there is one.

CI has no GPU, so these skip there (saying why); on a GPU machine they check
what the test double in ``tests/agent/nvml_double.py`` takes on trust. A CUDA
process here is a few lines of the CUDA driver API through ctypes (no
framework): it allocates, prints its pid and what it holds, and keeps it until
its stdin closes.

The MPS test starts an MPS control daemon of its own (private pipe and log
folders) and so runs only when asked: ``HEADROOM_TEST_MPS=1``. What it checks
is what the guard relies on under ``sharing: mps``: each client is listed with
its own memory, apart from the MPS server, and the pin Headroom writes
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, :func:`headroom.rewrite.mps_limit`)
bounds what NVML measures of the client, its CUDA context included, with ``M``
read as MiB.
"""

import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.nvml import NvmlProbe
from agent.probe import GPUProcess, Snapshot
from headroom.quantity import GIB, MIB
from headroom.rewrite import mps_limit


def _driver_missing() -> str:
    for library in ("libnvidia-ml.so.1", "libcuda.so.1"):
        try:
            ctypes.CDLL(library)
        except OSError:
            return (
                f"no NVIDIA driver on this machine ({library} is not loadable): "
                "the NVML backend meets a real driver only on a GPU machine"
            )
    return ""


pytestmark = pytest.mark.skipif(bool(_driver_missing()), reason=_driver_missing() or "-")

CUDA_PROCESS = r"""
import ctypes, json, os, sys

cuda = ctypes.CDLL("libcuda.so.1")


def check(rc, what):
    if rc != 0:
        print(json.dumps({"error": f"{what} returned CUresult {rc}"}), flush=True)
        sys.exit(1)


check(cuda.cuInit(0), "cuInit")
device, context = ctypes.c_int(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
mode, size = sys.argv[1], int(sys.argv[2])
pointer, held = ctypes.c_uint64(), 0
while held < (1 << 40):
    rc = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
    if rc == 2 and mode == "fill":  # CUDA_ERROR_OUT_OF_MEMORY: as far as it may go
        break
    check(rc, "cuMemAlloc")
    held += size
    if mode == "hold":
        break
print(json.dumps({"pid": os.getpid(), "held": held}), flush=True)
sys.stdin.read()
"""


class CudaProcess:
    def __init__(self, mode: str, size: int, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CUDA_PROCESS, mode, str(size)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **(env or {})},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            pytest.fail(f"the CUDA process died before it allocated: {stderr[-2000:]}")
        said = json.loads(line)
        if "error" in said:
            self.stop()
            pytest.fail(f"the CUDA process failed: {said['error']}")
        self.pid: int = said["pid"]
        self.held: int = said["held"]

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def listed(snapshot: Snapshot, pid: int) -> GPUProcess | None:
    for gpu in snapshot.gpus:
        for process in gpu.processes:
            if process.pid == pid:
                return process
    return None


def command(pid: int | None) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""  # gone, or another pid namespace's


def eventually(probe: NvmlProbe, ok: Callable[[Snapshot], bool], timeout: float = 10.0) -> Snapshot:
    deadline = time.monotonic() + timeout
    while True:
        snapshot = probe.snapshot()
        if ok(snapshot) or time.monotonic() > deadline:
            return snapshot
        time.sleep(0.2)


@pytest.fixture
def probe() -> Iterator[NvmlProbe]:
    nvml = NvmlProbe()
    yield nvml
    nvml.close()


def test_reads_every_gpu(probe: NvmlProbe) -> None:
    snapshot = probe.snapshot()
    assert snapshot.gpus, "NVML lists no GPU, yet the driver loaded"
    for gpu in snapshot.gpus:
        assert not gpu.error, gpu.error
        assert gpu.uuid.startswith("GPU-"), gpu.uuid
        assert gpu.product
        assert gpu.total_bytes > GIB
        assert 0 <= gpu.used_bytes <= gpu.total_bytes
        assert 0 <= gpu.free_bytes <= gpu.total_bytes


def test_a_cuda_process_is_listed_with_what_it_holds_then_gone(probe: NvmlProbe) -> None:
    process = CudaProcess("hold", GIB)
    try:
        seen = listed(eventually(probe, lambda s: listed(s, process.pid) is not None), process.pid)
        assert seen is not None, f"NVML does not list CUDA process {process.pid}"
        assert seen.used_bytes is not None, "the driver could not attribute its memory"
        # What it allocated, and its CUDA context on top (about 0.5 GiB on an H100).
        assert GIB <= seen.used_bytes <= GIB + 2 * GIB, seen.used_bytes / MIB
    finally:
        process.stop()
    after = eventually(probe, lambda s: listed(s, process.pid) is None)
    assert listed(after, process.pid) is None, "NVML still lists a process that has exited"


@pytest.fixture
def mps() -> Iterator[dict[str, str]]:
    if os.environ.get("HEADROOM_TEST_MPS") != "1":
        pytest.skip(
            "starts an MPS control daemon on the GPU: set HEADROOM_TEST_MPS=1 on a GPU "
            "machine you may use so"
        )
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        pytest.skip("nvidia-cuda-mps-control is not on PATH")
    root = Path(f"/tmp/headroom-mps-{os.getpid()}")
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
    }
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    subprocess.run([control, "-d"], env={**os.environ, **env}, check=True, timeout=30)
    try:
        yield env
    finally:
        subprocess.run([control], input="quit\n", text=True, env={**os.environ, **env}, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def test_mps_clients_are_listed_apart_and_the_pin_bounds_what_nvml_measures(
    probe: NvmlProbe, mps: dict[str, str]
) -> None:
    declared = 1536 * MIB
    pin = f"0={mps_limit(declared)}"
    assert pin == "0=1536M"
    pinned = CudaProcess("fill", 16 * MIB, {**mps, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": pin})
    free = CudaProcess("hold", GIB, mps)
    try:
        snapshot = eventually(
            probe, lambda s: None not in (listed(s, pinned.pid), listed(s, free.pid))
        )
        seen_pinned, seen_free = listed(snapshot, pinned.pid), listed(snapshot, free.pid)
        assert seen_pinned is not None
        assert seen_pinned.used_bytes is not None
        assert seen_free is not None
        assert seen_free.used_bytes is not None
        # Each client apart, with its own memory: the guard can judge each pod.
        assert GIB <= seen_free.used_bytes <= 3 * GIB, seen_free.used_bytes / MIB
        # The pin bounds the whole client, its context included, so a pinned pod is
        # never over its declaration in the guard's eyes ...
        assert seen_pinned.used_bytes <= declared, seen_pinned.used_bytes / MIB
        # ... and M is MiB: 1536 MB would stop it below 1465 MiB.
        assert seen_pinned.used_bytes > 1536 * 10**6, seen_pinned.used_bytes / MIB
        assert pinned.held < declared
        # The MPS server is listed too, apart from its clients and holding little.
        servers = [
            process
            for gpu in snapshot.gpus
            for process in gpu.processes
            if process.pid not in (pinned.pid, free.pid)
            and command(process.pid).startswith("nvidia-cuda-mps")
        ]
        assert servers, "the MPS server is not listed"
        assert all((s.used_bytes or 0) < 512 * MIB for s in servers), servers
    finally:
        pinned.stop()
        free.stop()
