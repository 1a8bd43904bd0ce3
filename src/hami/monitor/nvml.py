"""Host GPU readings through NVML (``nvidia-ml-py``), taken at scrape time.

:func:`read_host` returns one :class:`HostGPU` per device (memory used, GPU and memory-controller
utilisation, and the memory each host PID holds on it). Any NVML call that fails leaves that one
value out; a scrape never fails because of one device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping

import pynvml

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HostGPU:
    index: int
    uuid: str
    name: str
    memory_used: int | None = None  # bytes
    utilization: int | None = None  # percent (0-100)
    memory_utilization: int | None = None  # percent
    process_memory: Mapping[int, int] = field(default_factory=dict)  # host PID -> bytes

    @property
    def device_type(self) -> str:
        """Same rule as the node registration ``type``: ``NVIDIA-`` unless the name starts with it."""
        return self.name if self.name.startswith("NVIDIA") else f"NVIDIA-{self.name}"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _try(call: Callable[[], object], what: str) -> object | None:
    try:
        return call()
    except pynvml.NVMLError as exc:
        log.debug("NVML %s failed: %s", what, exc)
        return None


def _processes(handle: object) -> dict[int, int]:
    procs = _try(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle), "running processes") or []
    out: dict[int, int] = {}
    for p in procs:  # a PID may appear once per context; add them up
        used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else 0
        out[int(p.pid)] = out.get(int(p.pid), 0) + used
    return out


def read_host() -> list[HostGPU]:
    """Every device NVML shows (NVML must have been initialised)."""
    count = _try(pynvml.nvmlDeviceGetCount, "device count") or 0
    gpus: list[HostGPU] = []
    for i in range(int(count)):
        handle = _try(lambda: pynvml.nvmlDeviceGetHandleByIndex(i), f"handle {i}")
        if handle is None:
            continue
        uuid = _try(lambda: _text(pynvml.nvmlDeviceGetUUID(handle)), "uuid")
        if not uuid:
            continue
        mem = _try(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle), "memory info")
        util = _try(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle), "utilization")
        gpus.append(HostGPU(
            index=i, uuid=str(uuid), name=str(_try(lambda: _text(pynvml.nvmlDeviceGetName(handle)), "name") or ""),
            memory_used=int(mem.used) if mem is not None else None,
            utilization=int(util.gpu) if util is not None else None,
            memory_utilization=int(util.memory) if util is not None else None,
            process_memory=_processes(handle),
        ))
    return gpus
