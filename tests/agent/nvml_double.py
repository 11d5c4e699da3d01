"""A test double of the ``pynvml`` module: the functions the agent calls, over
devices described in Python.

There is no GPU here, so the C library cannot answer. What the double returns
is what pynvml itself returns, built from pynvml's own types: memory info is a
real ``c_nvmlMemory_t`` structure, processes are pynvml's friendly objects
made by its own ``nvmlStructToFriendlyObject`` from ``c_nvmlProcessInfo_v3_t``,
errors are pynvml's generated ``NVMLError_*`` subclasses. Strings are ``str``
(nvidia-ml-py >= 11.515) or ``bytes`` (older releases), as chosen.
"""

from dataclasses import dataclass, field
from typing import Any

import pynvml

# Re-exported so that ``except nvml.NVMLError_...`` in the agent sees the real classes.
NVMLError = pynvml.NVMLError
NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
NVMLError_NotSupported = pynvml.NVMLError_NotSupported
NVMLError_NotFound = pynvml.NVMLError_NotFound
NVMLError_NoPermission = pynvml.NVMLError_NoPermission
NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost


@dataclass
class DeviceDouble:
    name: str
    uuid: str
    total: int
    used: int
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    """(pid, usedGpuMemory or None)."""
    mig_mode: int | None = None
    """None: MIG queries raise NotSupported (a pre-Ampere GPU)."""
    mig_slots: dict[int, "DeviceDouble"] = field(default_factory=dict)
    max_mig: int = 7
    processes_error: type[Exception] | None = None
    bus_id: str = "00000000:3B:00.0"


class PynvmlDouble:
    """Use as the ``nvml`` argument of :class:`agent.nvml.NvmlProbe`."""

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound

    def __init__(self, devices: list[DeviceDouble], *, strings_as_bytes: bool = False) -> None:
        self.devices = devices
        self.strings_as_bytes = strings_as_bytes
        self.init_error: Exception | None = None
        self.query_error: Exception | None = None
        self.initialised = False
        self.calls: list[str] = []

    def _text(self, value: str) -> str | bytes:
        return value.encode() if self.strings_as_bytes else value

    def _check(self, call: str) -> None:
        self.calls.append(call)
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        if self.query_error is not None:
            raise self.query_error
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> DeviceDouble:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[index]

    def nvmlDeviceGetName(self, handle: DeviceDouble) -> str | bytes:
        self._check("nvmlDeviceGetName")
        return self._text(handle.name)

    def nvmlDeviceGetUUID(self, handle: DeviceDouble) -> str | bytes:
        self._check("nvmlDeviceGetUUID")
        return self._text(handle.uuid)

    def nvmlDeviceGetPciInfo(self, handle: DeviceDouble) -> Any:
        self._check("nvmlDeviceGetPciInfo")
        return pynvml.nvmlPciInfo_t(busId=handle.bus_id.encode())

    def nvmlDeviceGetMemoryInfo(self, handle: DeviceDouble) -> Any:
        self._check("nvmlDeviceGetMemoryInfo")
        return pynvml.c_nvmlMemory_t(
            total=handle.total, free=handle.total - handle.used, used=handle.used
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: DeviceDouble) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses")
        if handle.processes_error is not None:
            raise handle.processes_error()
        infos = []
        for pid, used in handle.processes:
            raw = pynvml.c_nvmlProcessInfo_v3_t(
                pid=pid,
                usedGpuMemory=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                if used is None
                else used,
            )
            info = pynvml.nvmlStructToFriendlyObject(raw)
            # pynvml's own translation of "not available" (see its process functions).
            if info.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                info.usedGpuMemory = None
            infos.append(info)
        return infos

    def nvmlDeviceGetMigMode(self, handle: DeviceDouble) -> list[int]:
        self._check("nvmlDeviceGetMigMode")
        if handle.mig_mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [handle.mig_mode, handle.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: DeviceDouble) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount")
        return handle.max_mig

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: DeviceDouble, index: int) -> DeviceDouble:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex")
        if index not in handle.mig_slots:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return handle.mig_slots[index]
