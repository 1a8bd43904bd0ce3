"""The v1 shared-region layout, written down from the reference (hami-core.md §4.2), and
readers for the file libvgpu writes. Offsets are absolute bytes (x86-64, glibc)."""

from __future__ import annotations

import struct
from pathlib import Path

REGION_SIZE = 2_008_952  # file length is this + 1
MAGIC = 19920718
MAX_DEV, MAX_PROC, SLOT_SIZE, UUID_LEN = 16, 1024, 1960, 96

# (field, offset, struct format) of the header
HEADER = [
    ("initialized_flag", 0, "i"),
    ("major_version", 4, "I"),
    ("minor_version", 8, "I"),
    ("sm_init_flag", 12, "i"),
    ("owner_pid", 16, "Q"),
    ("sem", 24, "32s"),
    ("device_num", 56, "Q"),
    ("uuids", 64, f"{MAX_DEV * UUID_LEN}s"),
    ("limit", 1600, f"{MAX_DEV}Q"),
    ("sm_limit", 1728, f"{MAX_DEV}Q"),
    ("procs", 1856, f"{MAX_PROC * SLOT_SIZE}s"),
    ("proc_num", 2_008_896, "i"),
    ("utilization_switch", 2_008_900, "i"),
    ("recent_kernel", 2_008_904, "i"),
    ("priority", 2_008_908, "i"),
    ("last_kernel_time", 2_008_912, "Q"),
    ("sem_postinit", 2_008_920, "32s"),
]
# offsets inside one process slot
SLOT = [
    ("pid", 0, "i"),
    ("hostpid", 4, "i"),
    ("used", 8, f"{MAX_DEV * 8}Q"),  # per device: context, module, data, offset, total, 3 unused
    ("monitorused", 1032, f"{MAX_DEV}Q"),
    ("device_util", 1160, f"{MAX_DEV * 6}Q"),  # per device: dec, enc, sm, 3 unused
    ("status", 1928, "i"),
    ("seqlock", 1936, "Q"),
    ("unused", 1944, "2Q"),
]
DEVMEM = ["context_size", "module_size", "data_size", "offset", "total"]


def _unpack(buf: bytes, base: int, table) -> dict:
    out = {}
    for name, off, fmt in table:
        vals = struct.unpack_from("<" + fmt, buf, base + off)
        out[name] = vals[0] if len(vals) == 1 else list(vals)
    return out


def parse_slot(buf: bytes, base: int) -> dict:
    s = _unpack(buf, base, SLOT)
    s["used"] = [dict(zip(DEVMEM, s["used"][d * 8 : d * 8 + 5])) for d in range(MAX_DEV)]
    s["device_util"] = [
        dict(zip(("dec_util", "enc_util", "sm_util"), s["device_util"][d * 6 : d * 6 + 3])) for d in range(MAX_DEV)
    ]
    return s


def read_region(path) -> dict:
    buf = Path(path).read_bytes()
    r = _unpack(buf, 0, HEADER)
    r["file_size"] = len(buf)
    r["uuids"] = [r["uuids"][i * UUID_LEN : (i + 1) * UUID_LEN].split(b"\0")[0].decode() for i in range(MAX_DEV)]
    n = max(0, min(r["proc_num"], MAX_PROC))
    r["slots"] = [parse_slot(buf, 1856 + i * SLOT_SIZE) for i in range(n)]
    del r["procs"]
    return r


def poke_slot_total(path, slot: int, dev: int, value: int) -> None:
    """Overwrite used[dev].total of a slot (to simulate a corrupted/over-limit ledger)."""
    off = 1856 + slot * SLOT_SIZE + 8 + dev * 64 + 32
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(struct.pack("<Q", value))


# The region lock (libvgpu's own use of the layout, not HAMi's): a robust process-shared pthread
# mutex in the last process slot, which no process takes (proc_num stays <= LOCK_SLOT).
LOCK_SLOT = MAX_PROC - 1
LOCK_MAGIC = 0x4C6B5631
LOCK_MAGIC_OFFSET = 1856 + LOCK_SLOT * SLOT_SIZE + 8  # u32, set once the mutex is initialised
LOCK_OFFSET = 1856 + LOCK_SLOT * SLOT_SIZE + 40  # pthread_mutex_t (40 bytes)
BOOT_ID_OFFSET = LOCK_OFFSET + 40  # char[40]: the kernel's boot id at the last attach


def read_lock_slot(path) -> dict:
    buf = Path(path).read_bytes()
    base = 1856 + LOCK_SLOT * SLOT_SIZE
    s = parse_slot(buf, base)
    return {
        "pid": s["pid"],
        "status": s["status"],
        "magic": struct.unpack_from("<I", buf, LOCK_MAGIC_OFFSET)[0],
        "mutex_owner_tid": struct.unpack_from("<i", buf, LOCK_OFFSET)[0] & 0x3FFFFFFF,
        "boot_id": buf[BOOT_ID_OFFSET : BOOT_ID_OFFSET + 40].split(b"\0")[0].decode(),
    }


def fill_slots(path, pid: int, count: int) -> None:
    """Mark slots 0..count-1 as taken by `pid` and set proc_num = count (a full region). The
    slots name no PID namespace (as a libvgpu that takes no slot lock writes them): judged by
    `pid` alone, not by a lock byte that nobody holds for them (which would make them dead)."""
    with open(path, "r+b") as f:
        for i in range(count):
            f.seek(1856 + i * SLOT_SIZE)
            f.write(struct.pack("<i", pid))
            f.seek(1856 + i * SLOT_SIZE + 1928)
            f.write(struct.pack("<ii", 1, 0))
        f.seek(2_008_896)
        f.write(struct.pack("<i", count))


def take_slot_as_hami_core(path, slot: int, pid: int, dev: int, total: int) -> None:
    """Register ``pid`` in ``slot`` holding ``total`` bytes on ``dev`` the way a library that keeps
    no namespace mark writes it (HAMi-core, an older libvgpu): pid, status and the device's usage
    only, the rest of the slot left as it was; proc_num raised to cover the slot."""
    base = 1856 + slot * SLOT_SIZE
    with open(path, "r+b") as f:
        f.seek(base)
        f.write(struct.pack("<i", pid))
        f.seek(base + 8 + dev * 64 + 32)
        f.write(struct.pack("<Q", total))
        f.seek(base + 1928)
        f.write(struct.pack("<i", 1))
        f.seek(2_008_896)
        (n,) = struct.unpack("<i", f.read(4))
        f.seek(2_008_896)
        f.write(struct.pack("<i", max(n, slot + 1)))
