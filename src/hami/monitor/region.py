"""Reading HAMi's per-container shared region (the file libvgpu / HAMi-core writes).

Two layouts are understood (reference hami-control-plane §9.3, hami-core §4.2):

- **v1** (``shared_region_t`` of HAMi-core 1.x and of our ``native/libvgpu``): 2,008,952 bytes,
  header ``magic, major, minor``; the file is one byte longer than the struct.
- **v0** (older HAMi-core): 1,197,896 bytes, no version fields, 1,168-byte process slots.

Nothing in a file is trusted before it is checked: the magic (19920718), the version and the
size come first; ``device_num`` and ``proc_num`` are clamped to 16 and 1024; a UUID that is not
UTF-8 is dropped. The file is read with ``pread`` rather than ``mmap``: a region truncated
while we hold it then gives a short read (an error we report) instead of a SIGBUS that would
kill the exporter. The only writes (the feedback loop's two ``int32`` fields, and the lease of a
block, below) go through ``pwrite`` at fixed offsets, which the library sees through its own
``MAP_SHARED`` mapping.

**Priority lease.** Our libvgpu honours a block (``recent_kernel = -1``) only while the monitor's
lease on it runs, so a monitor that dies after blocking leaves nobody stalled. The lease lives in
the layout's last process slot, which holds libvgpu's region lock and which no process takes
(HAMi's monitor reads only ``procs[0..proc_num)``): libvgpu writes :data:`LEASE_MAGIC` at
:data:`LEASE_MAGIC_AT` (with its lock's marker at :data:`LOCK_MAGIC_AT`: ``Region.priority_lease``),
and :func:`write_int32` writes ``until`` (``CLOCK_MONOTONIC`` milliseconds) at
:data:`LEASE_UNTIL_AT` before each -1 it writes there, and 0 after lifting a block (no lease: a
-1 from a monitor that grants none, HAMi's, holds until lifted, as HAMi-core has it). HAMi-core
regions carry no mark and get no lease.

The file lies in a directory the container mounts read-write, so the container decides what the
path is. It is opened only as a regular file of its own (:func:`_open_regular`): a symbolic link
is refused (it could name another pod's region, or anything else the monitor can reach), the
open never blocks (a FIFO would block it until a writer comes: for ever), and what was opened must
be a regular file, checked on the descriptor.

A process slot of our libvgpu carries a mark (its PID namespace, in the slot's padding at 1932)
when its process holds an open-file-description (OFD) lock on byte ``size + 1 + index`` of the
file; the kernel drops that lock when the process is gone, however it ended. A marked slot whose
byte nobody holds is a dead process's: its charge is not counted (libvgpu clears such a slot only
at its next allocation or exit, and a SIGKILLed process never reaches its ``atexit``). The byte is
only queried (``F_OFD_GETLK``, which takes nothing), so the monitor holds no lock on the file and
closing its descriptor releases nobody's. Unmarked slots (HAMi-core, v0) are judged by their status
and PID alone, as HAMi's monitor does.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import time
from dataclasses import dataclass

MAGIC = 19920718
MAX_DEVICES = 16
MAX_PROCS = 1024
UUID_LEN = 96
#: ``fcntl`` command of an OFD lock query (36 on every Linux architecture; Python >= 3.9 names it)
F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
#: ``struct flock`` of LP64 Linux: l_type, l_whence (short), l_start, l_len (off_t), l_pid, padding
_FLOCK = "hhqqi4x"
#: v1 only, in the last process slot (libvgpu's, see the module docstring and native/libvgpu/limiter.h):
#: libvgpu's region-lock marker, its lease mark, and the lease's end (u64, CLOCK_MONOTONIC ms)
LOCK_MAGIC_AT, LOCK_MAGIC = 2006944, 0x4C6B5631
LEASE_MAGIC_AT, LEASE_MAGIC = 2008824, 0x4C655031
LEASE_UNTIL_AT = 2008832
#: the longest lease the monitor writes: libvgpu takes one more than 60 s ahead (LIM_LEASE_MAX_MS)
#: for none, and the library reads it a moment after the monitor's clock was read
LEASE_MAX_S = 55.0
#: what a lease covers beyond two periods: a round's own reads and writes, and a late timer
LEASE_SLACK_S = 5.0


def lease_for(interval_s: float) -> float:
    """How long a block holds without being written again, for feedback rounds ``interval_s``
    apart: ``2 * interval_s + LEASE_SLACK_S`` (a round may be up to one period plus the slack
    late before the block lapses), at most :data:`LEASE_MAX_S`. The rounds run on a timer of
    their own (``hami.monitor.command``), so the pod list and the clean-up never delay a renewal.
    Until 1 Dec the lease was a fixed 15 s while renewals came ``--interval`` + pod list (up to
    10 s) + clean-up (up to 30 s) apart: with ``--interval 20s`` a blocked container ran free about
    5 s of every 20, warning in its own log at each lapse (found by review)."""
    return min(2 * max(interval_s, 0.0) + LEASE_SLACK_S, LEASE_MAX_S)


#: the lease at the default --interval (5 s): 15 s
LEASE_S = lease_for(5.0)


class RegionError(ValueError):
    """A region file that cannot be trusted; the message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Byte offsets of one shared-region version (x86-64 natural alignment)."""

    name: str
    size: int
    device_num: int
    uuids: int
    limit: int
    sm_limit: int
    procs: int
    slot_size: int
    slot_used_stride: int  # bytes per used[dev] entry
    slot_monitorused: int
    slot_util: int
    slot_util_stride: int
    slot_status: int
    slot_seqlock: int | None
    slot_mark: int | None  # int32 PID-namespace mark of our libvgpu (0: none; see the module docstring)
    proc_num: int
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int | None


V1 = Layout(
    name="v1",
    size=2008952,
    device_num=56,
    uuids=64,
    limit=1600,
    sm_limit=1728,
    procs=1856,
    slot_size=1960,
    slot_used_stride=64,
    slot_monitorused=1032,
    slot_util=1160,
    slot_util_stride=48,
    slot_status=1928,
    slot_seqlock=1936,
    slot_mark=1932,
    proc_num=2008896,
    utilization_switch=2008900,
    recent_kernel=2008904,
    priority=2008908,
    last_kernel_time=2008912,
)
V0 = Layout(
    name="v0",
    size=1197896,
    device_num=48,
    uuids=56,
    limit=1592,
    sm_limit=1720,
    procs=1848,
    slot_size=1168,
    slot_used_stride=40,
    slot_monitorused=648,
    slot_util=776,
    slot_util_stride=24,
    slot_status=1160,
    slot_seqlock=None,
    slot_mark=None,
    proc_num=1197880,
    utilization_switch=1197884,
    recent_kernel=1197888,
    priority=1197892,
    last_kernel_time=None,
)
HEADER_SIZE = 12  # magic, major, minor


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One process's usage of one device, bytes (HAMi-core's ``used[dev]``)."""

    context: int = 0
    module: int = 0
    buffer: int = 0  # HAMi-core's data_size
    total: int = 0


@dataclass(frozen=True, slots=True)
class ProcessSlot:
    pid: int
    hostpid: int
    status: int  # 1 running, 2 suspended (0 = exited, or a marked slot whose lock byte is free: not returned)
    used: tuple[DeviceMemory, ...]  # per region device
    monitorused: tuple[int, ...]  # NVML usedGpuMemory written by the library's watcher
    sm_util: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Region:
    """A consistent-enough reading of one region file."""

    path: str
    layout: str  # "v0" | "v1"
    major: int
    minor: int
    uuids: tuple[str, ...]  # per region device; "" when the field is not valid UTF-8
    limits: tuple[int, ...]  # bytes, 0 = none
    sm_limits: tuple[int, ...]
    procs: tuple[ProcessSlot, ...]
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int  # Unix seconds, 0 = never / unknown
    proc_num_raw: int  # as found in the file, before clamping
    priority_lease: bool = False  # its library expires a block with the monitor's lease (module docstring)

    def used(self, dev: int) -> DeviceMemory:
        """Sum over live processes of ``used[dev]``."""
        c = m = b = t = 0
        for p in self.procs:
            u = p.used[dev]
            c, m, b, t = c + u.context, m + u.module, b + u.buffer, t + u.total
        return DeviceMemory(c, m, b, t)

    def sm_util(self, dev: int) -> int:
        return sum(p.sm_util[dev] for p in self.procs)

    def hostpids(self) -> tuple[int, ...]:
        return tuple(sorted({p.hostpid for p in self.procs if p.hostpid > 0}))


def _u64s(buf: bytes, off: int, n: int) -> tuple[int, ...]:
    return struct.unpack_from(f"<{n}Q", buf, off)


def _uuid(raw: bytes) -> str:
    raw = raw.split(b"\0", 1)[0]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    return text if text.isprintable() else ""


def _pread_exact(fd: int, size: int, offset: int, path: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise RegionError(f"{path}: truncated while reading (wanted {size} bytes at offset {offset}, got {len(data)})")
    return data


def choose_layout(size: int, major: int, path: str = "region") -> Layout:
    """Version selection as HAMi's monitor does it: by file size, then ``major``."""
    if size >= V1.size:
        if major != 1:
            raise RegionError(f"{path}: unsupported major version {major} (size {size} bytes; expected 1)")
        return V1
    if size >= V0.size:
        return V0
    raise RegionError(f"{path}: {size} bytes is smaller than any known layout (v0 needs {V0.size}, v1 {V1.size})")


def _devmem(buf: bytes, off: int) -> DeviceMemory:
    context, module, data, _offset, total = struct.unpack_from("<5Q", buf, off)
    return DeviceMemory(context, module, data, total)


def _slot(buf: bytes, base: int, lay: Layout, ndev: int) -> tuple[int, int, int, tuple]:
    pid, hostpid = struct.unpack_from("<ii", buf, base)
    (status,) = struct.unpack_from("<i", buf, base + lay.slot_status)
    used = tuple(_devmem(buf, base + 8 + d * lay.slot_used_stride) for d in range(ndev))
    monitorused = _u64s(buf, base + lay.slot_monitorused, ndev)
    # device_util[d] = {dec_util, enc_util, sm_util, ...}: sm_util is the third u64
    util = tuple(_u64s(buf, base + lay.slot_util + d * lay.slot_util_stride + 16, 1)[0] for d in range(ndev))
    return pid, hostpid, status, (used, monitorused, util)


def _open_regular(path: str, flags: int) -> int:
    """``path`` opened with ``flags`` if it is a regular file and not a symbolic link; never blocks.

    The name is resolved once, with ``O_PATH | O_NOFOLLOW``: that opens neither a device nor a
    FIFO (opening some devices has effects of its own) and gives the link itself for a link. The
    descriptor is checked with ``fstat``, and only a regular file is then opened for reading or
    writing, through ``/proc/self/fd`` (the same inode, whatever the container renames over the
    name meanwhile), with ``O_NONBLOCK | O_NOCTTY``. Raises :class:`RegionError`.
    """
    try:
        ref = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RegionError(f"{path}: cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(ref)
        if stat.S_ISLNK(info.st_mode):
            raise RegionError(f"{path}: is a symbolic link; not following it")
        if not stat.S_ISREG(info.st_mode):
            raise RegionError(f"{path}: not a regular file")
        fd = os.open(f"/proc/self/fd/{ref}", flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise RegionError(f"{path}: cannot open: {exc.strerror}") from None
    finally:
        os.close(ref)
    try:
        now = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise RegionError(f"{path}: cannot open: {exc.strerror}") from None
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
        os.close(fd)
        raise RegionError(f"{path}: not a regular file (replaced while being opened)")
    return fd


def read_region(path: str) -> Region:
    """Read and validate one region file. Raises :class:`RegionError` (never anything else for bad content)."""
    fd = _open_regular(path, os.O_RDONLY)
    try:
        return _read_fd(fd, path)
    except OSError as exc:
        raise RegionError(f"{path}: read failed: {exc.strerror}") from None
    finally:
        os.close(fd)


def _read_fd(fd: int, path: str) -> Region:
    size = os.fstat(fd).st_size
    if size < HEADER_SIZE:
        raise RegionError(f"{path}: {size} bytes is smaller than the {HEADER_SIZE}-byte header")
    magic, major, minor = struct.unpack("<iii", _pread_exact(fd, HEADER_SIZE, 0, path))
    if magic != MAGIC:
        raise RegionError(f"{path}: bad magic {magic} (expected {MAGIC}; not initialised or not a region)")
    lay = choose_layout(size, major, path)
    if lay is V0:
        major, minor = 0, 0
    head = _pread_exact(fd, lay.procs, 0, path)
    ndev = min(max(_u64s(head, lay.device_num, 1)[0], 0), MAX_DEVICES)
    uuids = tuple(_uuid(head[lay.uuids + i * UUID_LEN : lay.uuids + (i + 1) * UUID_LEN]) for i in range(ndev))
    limits = _u64s(head, lay.limit, ndev)
    sm_limits = _u64s(head, lay.sm_limit, ndev)
    tail_len = (lay.last_kernel_time + 8 if lay.last_kernel_time else lay.priority + 4) - lay.proc_num
    tail = _pread_exact(fd, tail_len, lay.proc_num, path)
    proc_num_raw, switch, recent, priority = struct.unpack_from("<iiii", tail, 0)
    last_kernel = struct.unpack_from("<q", tail, 16)[0] if lay.last_kernel_time else 0
    nproc = min(max(proc_num_raw, 0), MAX_PROCS)
    procs = _read_slots(fd, path, lay, ndev, nproc)
    leases = lay is V1 and _leases(fd, path)
    # the header may have been re-initialised under us: the magic must still be there
    if struct.unpack("<i", _pread_exact(fd, 4, 0, path))[0] != MAGIC:
        raise RegionError(f"{path}: magic changed while reading")
    return Region(
        path=path,
        layout=lay.name,
        major=major,
        minor=minor,
        uuids=uuids,
        limits=limits,
        sm_limits=sm_limits,
        procs=procs,
        utilization_switch=switch,
        recent_kernel=recent,
        priority=priority,
        last_kernel_time=max(last_kernel, 0),
        proc_num_raw=proc_num_raw,
        priority_lease=leases,
    )


def _leases(fd: int, path: str) -> bool:
    """Whether a v1 region's library honours a block only while its lease runs (both marks)."""
    (lock,) = struct.unpack("<I", _pread_exact(fd, 4, LOCK_MAGIC_AT, path))
    (mark,) = struct.unpack("<I", _pread_exact(fd, 4, LEASE_MAGIC_AT, path))
    return lock == LOCK_MAGIC and mark == LEASE_MAGIC


def _read_slots(fd: int, path: str, lay: Layout, ndev: int, nproc: int, rounds: int = 3) -> tuple[ProcessSlot, ...]:
    """The live process slots, each read consistently where the layout has a seqlock.

    A slot's owner makes its ``seqlock`` odd while it updates the slot, and the seqlock lies after
    the slot's data. So a slot read in one pass is consistent when its sequence read in the pass
    before (before this pass read the data) and in this pass (after it) are the same even number.
    The slots that are not consistent are read again in up to ``rounds`` more passes of the whole
    array: the cost is bounded per region (a container that keeps every sequence odd buys at most
    ``2 + rounds`` reads of its slot array), and a slot that never settles (its owner died
    mid-update) is taken from the last pass, at most one update off.

    A slot with status 0 or PID 0 is not returned, nor a marked one (``slot_mark``) whose lock
    byte no process holds (:func:`_slot_lock_free`): its process is gone (SIGKILL, ``_exit``,
    ``exec``) with its charge still written.
    """
    if nproc == 0:
        return ()
    size = nproc * lay.slot_size
    buf = _pread_exact(fd, size, lay.procs, path)
    source = [buf] * nproc
    if lay.slot_seqlock is not None:
        seq_at = lay.slot_seqlock
        pending = range(nproc)
        for _ in range(1 + rounds):
            prev, buf = buf, _pread_exact(fd, size, lay.procs, path)
            left = []
            for i in pending:
                off = i * lay.slot_size + seq_at
                before = struct.unpack_from("<Q", prev, off)[0]
                source[i] = buf
                if before % 2 or before != struct.unpack_from("<Q", buf, off)[0]:
                    left.append(i)
            if not left:
                break
            pending = left
    out = []
    for i in range(nproc):
        pid, hostpid, status, parts = _slot(source[i], i * lay.slot_size, lay, ndev)
        if status == 0 or pid == 0:
            continue
        if lay.slot_mark is not None:
            (mark,) = struct.unpack_from("<i", source[i], i * lay.slot_size + lay.slot_mark)
            if mark != 0 and _slot_lock_free(fd, lay.size + 1 + i):
                continue
        used, monitorused, util = parts
        out.append(
            ProcessSlot(
                pid=pid, hostpid=hostpid, status=status, used=used, monitorused=tuple(monitorused), sm_util=util
            )
        )
    return tuple(out)


def _slot_lock_free(fd: int, offset: int) -> bool:
    """Whether no open file description holds a lock on byte ``offset`` of ``fd``'s file.

    ``F_OFD_GETLK`` only asks (the answer names a conflicting lock or ``F_UNLCK``); it takes no
    lock, so nothing the monitor does to its descriptor can release a libvgpu process's. A
    file system without OFD locks (the query fails) cannot tell: the slot counts, as libvgpu
    counts it then.
    """
    query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    try:
        answer = fcntl.fcntl(fd, F_OFD_GETLK, query)
    except OSError:
        return False
    return bool(struct.unpack(_FLOCK, answer)[0] == fcntl.F_UNLCK)


def write_int32(path: str, field: str, value: int, layout: str = "v1", *, lease_s: float = LEASE_S) -> None:
    """Write ``utilization_switch`` or ``recent_kernel`` of a region (the feedback loop's only writes).

    The file is opened as :func:`read_region` opens it (a regular file, no symbolic link, without
    blocking), and the magic and size are checked again first, so a file replaced by something
    else is not touched. A block (``recent_kernel`` < 0) of a region whose library takes leases
    (module docstring) is written after its lease, ``lease_s`` from now; any other value of
    ``recent_kernel`` there is followed by clearing the lease. Raises :class:`RegionError` or ``OSError``.
    """
    lay = V1 if layout == "v1" else V0
    offset = {"utilization_switch": lay.utilization_switch, "recent_kernel": lay.recent_kernel}[field]
    fd = _open_regular(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size < lay.size:
            raise RegionError(f"{path}: shrank below the {lay.name} size; not writing {field}")
        if struct.unpack("<i", os.pread(fd, 4, 0))[0] != MAGIC:
            raise RegionError(f"{path}: bad magic; not writing {field}")
        leases = field == "recent_kernel" and lay is V1 and _leases(fd, path)
        if leases and value < 0:  # the lease first: the library never sees this -1 without it
            until = int(time.monotonic() * 1000 + max(lease_s, 0) * 1000)
            os.pwrite(fd, struct.pack("<Q", until), LEASE_UNTIL_AT)
        os.pwrite(fd, struct.pack("<i", value), offset)
        if leases and value >= 0 and struct.unpack("<Q", _pread_exact(fd, 8, LEASE_UNTIL_AT, path))[0]:
            os.pwrite(fd, struct.pack("<Q", 0), LEASE_UNTIL_AT)  # lifted: no lease left behind
    finally:
        os.close(fd)
