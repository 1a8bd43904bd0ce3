"""Builders shared by the core's unit tests."""

from __future__ import annotations

from hami.core import DeviceInfo, Ledger, NodeDevices, SchedulerConfig, admit_pod
from hami.core.types import MigProfile
from hami.vendors import build_vendors

CONFIG = SchedulerConfig(build_vendors())

# A100-SXM4-40GB MIG profiles as NVML reports them: memory in 8 slices, (start, size) placements.
A100_40_MIG = (
    MigProfile("1g.5gb", 4864, 13, 1, tuple((s, 1) for s in range(7))),
    MigProfile("1g.10gb", 9856, 13, 1, ((0, 2), (2, 2), (4, 2), (6, 2))),
    MigProfile("2g.10gb", 9856, 26, 2, ((0, 2), (2, 2), (4, 2))),
    MigProfile("3g.20gb", 19968, 39, 3, ((0, 4), (4, 4))),
    MigProfile("4g.20gb", 19968, 52, 4, ((0, 4),)),
    MigProfile("7g.40gb", 40192, 91, 7, ((0, 8),)),
)


def mig_gpu(node: str, i: int, profiles=A100_40_MIG, health: bool = True, numa: int = 0) -> DeviceInfo:
    return DeviceInfo(
        id=f"GPU-{node}-{i}",
        index=i,
        count=7,
        devmem=40960,
        devcore=100,
        type="NVIDIA-A100-SXM4-40GB",
        numa=numa,
        mode="mig",
        health=health,
        vendor="NVIDIA",
        mig_profiles=profiles,
    )


def gpu(
    node: str,
    i: int,
    mem: int = 16384,
    cores: int = 100,
    count: int = 10,
    type_: str = "NVIDIA-Tesla T4",
    numa: int = 0,
    health: bool = True,
    mode: str = "hami-core",
) -> DeviceInfo:
    return DeviceInfo(
        id=f"GPU-{node}-{i}",
        index=i,
        count=count,
        devmem=mem,
        devcore=cores,
        type=type_,
        numa=numa,
        mode=mode,
        health=health,
        vendor="NVIDIA",
    )


def node(name: str, n: int = 4, cordoned=(), **kw) -> NodeDevices:
    return NodeDevices(
        name=name,
        devices=tuple(gpu(name, i, **kw) for i in range(n)),
        cordoned=frozenset(f"GPU-{name}-{i}" for i in cordoned),
    )


def ledger(*nodes: NodeDevices) -> Ledger:
    led = Ledger()
    for n in nodes:
        led.set_node(n)
    return led


def ctr(
    name: str = "c",
    gpu: int | None = 1,
    mem: int | None = None,
    cores: int | None = None,
    pct: int | None = None,
    sidecar: bool = False,
) -> dict:
    lim = {}
    for key, val in (
        ("nvidia.com/gpu", gpu),
        ("nvidia.com/gpumem", mem),
        ("nvidia.com/gpucores", cores),
        ("nvidia.com/gpumem-percentage", pct),
    ):
        if val is not None:
            lim[key] = val
    c = {"name": name, "resources": {"limits": lim}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def pod(name: str = "p", containers=None, init=None, annotations=None, ns: str = "default", admit: bool = True) -> dict:
    p = {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}", "annotations": dict(annotations or {})},
        "spec": {"containers": containers if containers is not None else [ctr()]},
    }
    if init:
        p["spec"]["initContainers"] = init
    return admit_pod(p, CONFIG.vendors)[0] if admit else p
