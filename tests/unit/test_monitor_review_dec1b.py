"""Monitor findings of the review of 1 Dec (b): a dead process's charge kept in the container's
series, the memory limit series taken from the region the tenant writes, and the region's own
UUID strings exported as ``device_uuid`` where no grant names the container's GPUs."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.monitor.exporter import ContainerGrant, MonitorCollector, PodRef
from hami.monitor.region import V1, read_region

from . import _regionkit as kit

MiB = 1 << 20
GiB = 1 << 30
UID = "0b6f3b4e-4444-4d7e-9a8e-dddddddddddd"
MARK = 1932  # vgpu_slot.pad0: libvgpu's PID-namespace mark (native/libvgpu/region.h)

# A libvgpu process as far as the monitor can see it: holds the OFD lock on its slot's byte
# (VGPU_REGION_SIZE + 1 + index, native/libvgpu/region.c slot_lock) until the kernel drops it.
HOLDER = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, int(sys.argv[2]), 1, 0))
print("held", flush=True)
sys.stdin.read()
"""


def _mark(path: str, slot: int, ns: int) -> None:
    with open(path, "r+b") as f:
        f.seek(V1.procs + slot * V1.slot_size + MARK)
        f.write(struct.pack("<I", ns))  # uint32, as libvgpu stores it


def _hold(path: str, slot: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, path, str(V1.size + 1 + slot)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()  # SIGKILL: no atexit, the slot keeps status 1 and its charge
    proc.wait()


def _byte_held(path: str, offset: int) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
    finally:
        os.close(fd)
    return struct.unpack("hhqqi4x", got)[0] != fcntl.F_UNLCK


def _three_slots(path) -> str:
    """Slot 0: a marked libvgpu process (2 GiB), slot 1: another (1 GiB), slot 2: HAMi-core (unmarked, 512 MiB)."""
    procs = [
        kit.Proc(pid=10, hostpid=1010, used={0: (0, 0, 2 * GiB, 2 * GiB)}, sm_util={0: 30}),
        kit.Proc(pid=11, hostpid=1011, used={0: (0, 0, GiB, GiB)}, sm_util={0: 20}),
        kit.Proc(pid=12, hostpid=1012, used={0: (0, 0, 512 * MiB, 512 * MiB)}, sm_util={0: 5}),
    ]
    p = kit.write(path, uuids=("GPU-1",), procs=procs)
    _mark(p, 0, 4026531836)
    _mark(p, 1, 4026531836)
    return p


def test_a_sigkilled_libvgpu_process_is_no_longer_counted(tmp_path):
    """Found by review, 1 Dec: libvgpu sets a slot's status to 0 only in its exit handler; a process
    SIGKILLed (or _exit, exec) left status 1 and its full charge, which the monitor summed for as
    long as the container lived. Its lock byte, which the kernel drops with the process, says it
    is gone: the slot is not counted. An unmarked (HAMi-core) slot is judged as before."""
    path = _three_slots(tmp_path / "r.cache")
    first, second = _hold(path, 0), _hold(path, 1)
    try:
        alive = read_region(path)
        again = read_region(path)  # the monitor's own open and close drop nobody's lock
        assert _byte_held(path, V1.size + 1) and _byte_held(path, V1.size + 2)
        _kill(first)
        after = read_region(path)
    finally:
        _kill(first)
        _kill(second)
    assert [p.pid for p in alive.procs] == [10, 11, 12]
    assert alive.used(0).total == 3 * GiB + 512 * MiB
    assert [p.pid for p in again.procs] == [10, 11, 12]
    assert [p.pid for p in after.procs] == [11, 12]  # was [10, 11, 12]: 2 GiB of a dead process
    assert after.used(0).total == GiB + 512 * MiB
    assert after.sm_util(0) == 25
    assert after.hostpids() == (1011, 1012)
    gone = read_region(path)  # both libvgpu processes gone; the unmarked slot still counts
    assert [p.pid for p in gone.procs] == [12]


def test_the_exported_series_drop_a_killed_process_charge(tmp_path):
    """Found by review, 1 Dec: the same, through the exporter: hami_vgpu_memory_used_bytes kept a
    SIGKILLed process's 2 GiB."""
    root = tmp_path / "containers"
    path = _three_slots(root / f"{UID}_main" / "r.cache")
    pods = {UID: PodRef("team", "web", UID, grants=(ContainerGrant("main", ("GPU-1",), 1),))}
    holders = [_hold(path, 0), _hold(path, 1)]
    try:
        before = _samples(root, pods)
        _kill(holders[0])
        after = _samples(root, pods)
    finally:
        for h in holders:
            _kill(h)
    used = "hami_vgpu_memory_used_bytes"
    assert before[used] == [({**_ctr("GPU-1")}, 3 * GiB + 512 * MiB)]
    assert after[used] == [({**_ctr("GPU-1")}, GiB + 512 * MiB)]


def _ctr(uuid: str, vdev: str = "0") -> dict[str, str]:
    return {"namespace": "team", "pod": "web", "container": "main", "vdevice_index": vdev, "device_uuid": uuid}


def _samples(root, pods, legacy: bool = False) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(
        MonitorCollector("n1", str(root), pods=(lambda: pods) if pods is not None else None, legacy=legacy)
    )
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k != "zone"}
            out.setdefault(s.name, []).append((labels, s.value))
    return out


def test_the_limit_series_is_the_grants_memory_not_the_regions(tmp_path):
    """Found by review, 1 Dec: hami_vgpu_memory_limit_bytes was the region's limit[], which the
    container writes (here 80 GiB on a 3000 MiB grant). With the grant's memory known, that is
    exported; a device the grant gives no memory for keeps the region's value."""
    root = tmp_path / "containers"
    kit.write(
        root / f"{UID}_main" / "r.cache",
        uuids=("GPU-1", "GPU-2"),
        limits=(80 * GiB, 5000 * MiB),
        procs=[kit.Proc(pid=1, used={0: (0, 0, MiB, MiB)})],
    )
    grant = ContainerGrant("main", ("GPU-1", "GPU-2"), 1, memory_mib=(("GPU-1", 3000),))
    got = _samples(root, {UID: PodRef("team", "web", UID, grants=(grant,))}, legacy=True)
    assert got["hami_vgpu_memory_limit_bytes"] == [(_ctr("GPU-1"), 3000 * MiB), (_ctr("GPU-2", "1"), 5000 * MiB)]
    assert got["vGPU_device_memory_limit_in_bytes"] == [
        (
            {"podnamespace": "team", "podname": "web", "ctrname": "main", "vdeviceid": "0", "deviceuuid": "GPU-1"},
            3000 * MiB,
        ),
        (
            {"podnamespace": "team", "podname": "web", "ctrname": "main", "vdeviceid": "1", "deviceuuid": "GPU-2"},
            5000 * MiB,
        ),
    ]
    # a grant without memory (callers that do not pass it): the region's value, as before
    plain = ContainerGrant("main", ("GPU-1", "GPU-2"), 1)
    got = _samples(root, {UID: PodRef("team", "web", UID, grants=(plain,))})
    assert [v for _, v in got["hami_vgpu_memory_limit_bytes"]] == [80 * GiB, 5000 * MiB]


def test_without_a_grant_the_regions_uuid_strings_are_not_exported(tmp_path):
    """Found by review, 1 Dec: where no grant names the container's GPUs (standalone, a pod without
    grants) each series' device_uuid was the region's UUID string, any text the tenant wrote
    (here another tenant's GPU and a made-up name). The series are kept, named by vdevice_index,
    with an empty device_uuid."""
    root = tmp_path / "containers"
    kit.write(
        root / f"{UID}_main" / "r.cache",
        uuids=("GPU-victim", "GPU-made-up"),
        procs=[kit.Proc(pid=1, used={0: (0, 0, 7 * MiB, 7 * MiB), 1: (0, 0, 3 * MiB, 3 * MiB)})],
    )
    for pods in (None, {UID: PodRef("team", "web", UID)}):
        got = _samples(root, pods, legacy=True)
        text = repr(got)
        assert "GPU-victim" not in text and "GPU-made-up" not in text
        used = got["hami_vgpu_memory_used_bytes"]
        assert [(lab["vdevice_index"], lab["device_uuid"], v) for lab, v in used] == [
            ("0", "", 7 * MiB),
            ("1", "", 3 * MiB),
        ]
        assert {lab["deviceuuid"] for lab, _ in got["vGPU_device_memory_usage_in_bytes"]} == {""}
