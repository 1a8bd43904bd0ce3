#!/usr/bin/env python3
"""A stand-in for nvidia-smi over NVML (pynvml), enough for tests/gpu/gpu_check.py to run its
GPU path against the fake GPU: `-L`, and `--query-gpu=F,... --format=csv,noheader[,nounits]`
with F in uuid, name, driver_version, memory.total, memory.used (MiB)."""

from __future__ import annotations

import sys

import pynvml as n


def field(h, name: str) -> str:
    if name == "uuid":
        return n.nvmlDeviceGetUUID(h)
    if name == "name":
        return n.nvmlDeviceGetName(h)
    if name == "driver_version":
        return n.nvmlSystemGetDriverVersion()
    if name in ("memory.total", "memory.used"):
        m = n.nvmlDeviceGetMemoryInfo(h)
        return str((m.total if name == "memory.total" else m.used) >> 20)
    raise SystemExit(f"fake nvidia-smi: unknown field {name!r}")


def main(argv: list[str]) -> int:
    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    if argv == ["-L"]:
        for i, h in enumerate(handles):
            print(f"GPU {i}: {n.nvmlDeviceGetName(h)} (UUID: {n.nvmlDeviceGetUUID(h)})")
        return 0
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query is None:
        print("fake nvidia-smi: only -L and --query-gpu are supported", file=sys.stderr)
        return 2
    for h in handles:
        print(", ".join(field(h, f) for f in query.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
