"""The NVML backend: what the NVIDIA driver says about this node's GPUs.

Through ``pynvml`` (package nvidia-ml-py). Version differences handled here:
strings come back as ``bytes`` from older releases and ``str`` from newer
ones; ``usedGpuMemory`` is None where the driver cannot attribute memory; MIG
queries raise ``NVMLError_NotSupported`` on GPUs without MIG. Without a driver
``nvmlInit`` raises ``NVMLError_LibraryNotFound`` or ``NVMLError_DriverNotLoaded``;
that becomes :class:`ProbeUnavailable` with a reason, retried every
``retry_seconds`` rather than on every tick, so a node without a driver costs
one failed ``dlopen`` a minute, not a crash loop.
"""

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.probe import GPU, BackendName, GPUProcess, MigDevice, ProbeUnavailable, Snapshot

log = logging.getLogger(__name__)

_MIG_NAME = re.compile(r"\bMIG\s+(?P<profile>\d+g\.\d+gb(?:[+-][a-z.]+)?)", re.IGNORECASE)
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_BUS_ID = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _load_pynvml() -> Any:
    import pynvml  # the C library is loaded later, by nvmlInit

    return pynvml


class NvmlProbe:
    """A :class:`agent.probe.Probe` over NVML; ``nvml`` is the ``pynvml`` module."""

    def __init__(
        self,
        nvml: Any = None,
        *,
        retry_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sysfs: Path = Path("/sys"),
    ) -> None:
        self._nvml = nvml if nvml is not None else _load_pynvml()
        self._sysfs = sysfs
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._initialised = False
        self._failure: ProbeUnavailable | None = None
        self._next_attempt = 0.0
        self.init_attempts = 0

    @property
    def blocking(self) -> bool:
        return True

    @property
    def name(self) -> BackendName:
        return "nvml"

    def snapshot(self) -> Snapshot:
        self._ensure_initialised()
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
            return Snapshot(gpus=tuple(self._gpu_or_error(index) for index in range(count)))
        except nvml.NVMLError as err:
            # A lost GPU or a driver reload: start over with nvmlInit, slowly.
            self.close()
            raise self._fail("NVMLQueryFailed", f"NVML query failed: {err}") from err

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as err:
                log.debug("nvmlShutdown: %s", err)

    # --- initialisation -----------------------------------------------------

    def _ensure_initialised(self) -> None:
        if self._initialised:
            return
        if self._failure is not None and self._clock() < self._next_attempt:
            raise self._failure
        nvml = self._nvml
        self.init_attempts += 1
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as err:
            raise self._fail(
                "NVMLLibraryNotFound",
                f"{err}: libnvidia-ml.so.1 is not loadable; is the NVIDIA driver installed and "
                "does the agent run with the NVIDIA container runtime?",
            ) from err
        except nvml.NVMLError_DriverNotLoaded as err:
            raise self._fail(
                "NVIDIADriverNotLoaded", f"{err}: the NVIDIA kernel driver is not loaded"
            ) from err
        except nvml.NVMLError as err:
            raise self._fail("NVMLInitFailed", f"nvmlInit failed: {err}") from err
        self._initialised = True
        self._failure = None

    def _fail(self, reason: str, message: str) -> ProbeUnavailable:
        """Remember why, so that ticks before the next attempt fail the same way."""
        self._failure = ProbeUnavailable(reason, message)
        self._next_attempt = self._clock() + self._retry_seconds
        return self._failure

    # --- one device -----------------------------------------------------------

    def _gpu_or_error(self, index: int) -> GPU:
        """One GPU, or (an NVML error on it alone) a GPU marked failed: it never fails the node."""
        nvml = self._nvml
        try:
            return self._gpu(index)
        except nvml.NVMLError as err:
            return GPU(index, "", "", 0, 0, 0, error=f"NVML error reading GPU {index}: {err}")

    def _gpu(self, index: int) -> GPU:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        mig_enabled = self._mig_enabled(handle)
        return GPU(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            product=_text(nvml.nvmlDeviceGetName(handle)),
            total_bytes=int(memory.total),
            used_bytes=int(memory.used),
            free_bytes=int(memory.free),
            mig_enabled=mig_enabled,
            mig_devices=self._mig_devices(handle) if mig_enabled else (),
            processes=() if mig_enabled else self._processes(handle),
            numa_node=self._numa_node(handle),
        )

    def _numa_node(self, handle: Any) -> int | None:
        """The GPU's NUMA node as the NVIDIA device plugin reads it and reports it to
        kubelet (go-nvlib ``GetNumaNode``: sysfs ``numa_node`` of the PCI device); None
        where it has none (-1) or it cannot be read. Never fails the GPU."""
        nvml = self._nvml
        try:
            bus = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except nvml.NVMLError as err:
            log.debug("no PCI bus ID: %s", err)
            return None
        domain, _, rest = bus.strip().partition(":")
        name = f"{domain[-4:]}:{rest}".lower()  # 00000000:3B:00.0 -> 0000:3b:00.0
        if not _BUS_ID.fullmatch(name):
            return None
        try:
            node = int((self._sysfs / "bus/pci/devices" / name / "numa_node").read_text())
        except (OSError, ValueError):
            return None
        return node if 0 <= node <= 1023 else None

    def _mig_enabled(self, handle: Any) -> bool:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return False  # pre-Ampere GPU, or a driver without MIG
        return int(current) == _MIG_ENABLED

    def _mig_devices(self, handle: Any) -> tuple[MigDevice, ...]:
        nvml = self._nvml
        devices = []
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError_NotFound:
                continue  # slot without a GPU instance: MIG geometry has gaps
            memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            match = _MIG_NAME.search(_text(nvml.nvmlDeviceGetName(mig)))
            devices.append(
                MigDevice(
                    uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                    profile=match["profile"] if match else "",
                    total_bytes=int(memory.total),
                    used_bytes=int(memory.used),
                    processes=self._processes(mig),
                )
            )
        return tuple(devices)

    def _processes(self, handle: Any) -> tuple[GPUProcess, ...]:
        nvml = self._nvml
        try:
            infos = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_NoPermission) as err:
            # Usage still counts, as unattributed memory: conservative for placement.
            log.debug("cannot list processes: %s", err)
            return ()
        return tuple(
            GPUProcess(
                pid=int(info.pid),
                used_bytes=None if info.usedGpuMemory is None else int(info.usedGpuMemory),
            )
            for info in infos
        )
