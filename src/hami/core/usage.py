"""Effective usage of a pod per device, by Kubernetes container semantics (§5.5, §10.5).

Containers are in annotation order (init containers first). A classic init container runs
alone, next to the native sidecars (init containers with ``restartPolicy: Always``) declared
before it. Regular containers run together with every sidecar. So, per device:

* init phase i:   usage(init i) + Σ usage(sidecars declared before i)
* steady phase:   Σ usage(sidecars) + Σ usage(regular containers)

and the pod holds, per device, the maximum over phases of memory, cores and container count
(slots, at least 1). HAMi counts sidecars as classic init containers (a peak, not a sum), which
under-accounts; this module is the fix. ``app_only=True`` gives the usage after every classic init
container has finished (the "shrink").
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from .types import ContainerKind, DeviceUse, PodSingleDevice

#: (container index, vendor, uuid, mem, cores)
Pick = tuple[int, str, str, int, int]


def picks_of(devices: Mapping[str, PodSingleDevice]) -> list[Pick]:
    out: list[Pick] = []
    for vendor in sorted(devices):
        for ci, cds in enumerate(devices[vendor]):
            out.extend((ci, vendor, d.uuid, d.usedmem, d.usedcores) for d in cds)
    return out


def collapse_picks(
    picks: Iterable[Pick], kinds: Sequence[ContainerKind], app_only: bool = False
) -> tuple[DeviceUse, ...]:
    """What the pod holds on each device: per term (slots, memory, cores), the larger of the
    steady phase (every sidecar and regular container together) and each classic init container's
    phase (that init container plus the sidecars declared before it).

    Worked example, one GPU shared by four containers, in annotation order:
    sidecar ``log`` 1000 MiB / 10 cores, init ``setup`` 6000 / 30, regular ``train`` 3000 / 40 and
    ``eval`` 2000 / 20. Phase ``setup``: log + setup = 7000 MiB, 40 cores, 2 containers.
    Steady: log + train + eval = 6000 MiB, 70 cores, 3 containers.
    Result: 3 slots, 7000 MiB, 70 cores (each term its own maximum; with ``app_only``: 3, 6000, 70).

    With ``app_only``, a device that only classic init containers used is left out: the pod no
    longer holds it (no slot, memory or cores).
    """
    # per uuid: vendor, steady [slots, mem, cores], sidecar running [slots, mem, cores] by index,
    # and the per-init-phase peaks
    per: dict[str, dict] = {}
    for ci, vendor, uuid, mem, cores in sorted(picks):
        kind = kinds[ci] if ci < len(kinds) else ContainerKind.APP
        if kind is ContainerKind.INIT and app_only:
            # a finished init container holds nothing: a device only it used gets no entry (an
            # entry of zero memory still took a slot and refused exclusive and mutex pods)
            continue
        st = per.setdefault(uuid, {"vendor": vendor, "steady": [0, 0, 0], "side": [], "init": []})
        if kind is ContainerKind.INIT:
            st["init"].append((ci, mem, cores))
            continue
        st["steady"][0] += 1
        st["steady"][1] += mem
        st["steady"][2] += cores
        if kind is ContainerKind.SIDECAR:
            st["side"].append((ci, mem, cores))
    out = []
    for uuid in sorted(per):
        st = per[uuid]
        slots, mem, cores = st["steady"]
        for ci, imem, icores in st["init"]:
            before = [s for s in st["side"] if s[0] < ci]
            slots = max(slots, 1 + len(before))
            mem = max(mem, imem + sum(s[1] for s in before))
            cores = max(cores, icores + sum(s[2] for s in before))
        out.append(DeviceUse(uuid=uuid, vendor=st["vendor"], slots=max(slots, 1), mem=mem, cores=cores))
    return tuple(out)


def collapse(
    devices: Mapping[str, PodSingleDevice], kinds: Sequence[ContainerKind], app_only: bool = False
) -> tuple[DeviceUse, ...]:
    """Collapsed per-device usage of one pod's allocation."""
    return collapse_picks(picks_of(devices), kinds, app_only)


def pod_peak(
    picks: Iterable[Pick], kinds: Sequence[ContainerKind], vendor: str, app_only: bool = False, masks: bool = False
) -> tuple[int, int]:
    """The most memory and cores the pod holds at once of ``vendor``'s devices, all of them
    together: the steady phase or one classic init container's phase (with the sidecars declared
    before it), each summed over the devices, each term its own maximum (``masks``: cores are
    core masks, counted by their bits). What a namespace quota counts, as the webhook does:
    :func:`collapse_picks` summed over the devices adds each device's own peak, which for a pod
    whose init container and regular containers use different GPUs is more than it ever holds."""
    steady = [0, 0]
    sides: list[tuple[int, int, int]] = []
    # init container index -> [mem, cores] over all its devices: one that takes several GPUs
    # holds them all at once in its phase (the webhook's memreq x nums)
    inits: dict[int, list[int]] = {}
    for ci, v, _uuid, mem, cores in sorted(picks):
        if v != vendor:
            continue
        kind = kinds[ci] if ci < len(kinds) else ContainerKind.APP
        n = cores.bit_count() if masks else cores
        if kind is ContainerKind.INIT:
            if not app_only:
                acc = inits.setdefault(ci, [0, 0])
                acc[0] += mem
                acc[1] += n
            continue
        steady[0] += mem
        steady[1] += n
        if kind is ContainerKind.SIDECAR:
            sides.append((ci, mem, n))
    mem, cores = steady
    for ci, (imem, icores) in inits.items():
        before = [x for x in sides if x[0] < ci]
        mem = max(mem, imem + sum(x[1] for x in before))
        cores = max(cores, icores + sum(x[2] for x in before))
    return mem, cores
