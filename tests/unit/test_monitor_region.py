"""hami.monitor.region: layouts, validation, clamping (regions built with ctypes in _regionkit)."""

from __future__ import annotations

import os
import struct

import pytest

from hami.monitor.region import MAX_PROCS, V0, V1, RegionError, read_region, write_int32

from . import _regionkit as kit

GiB = 1 << 30


def test_v1_layout_offsets_match_the_c_struct():
    r, s = kit.RegionV1, kit.SlotV1
    assert (V1.size, V1.slot_size) == (kit.C.sizeof(r), kit.C.sizeof(s))
    assert (V1.device_num, V1.uuids, V1.limit, V1.sm_limit, V1.procs) == (
        r.device_num.offset,
        r.uuids.offset,
        r.limit.offset,
        r.sm_limit.offset,
        r.procs.offset,
    )
    assert (V1.proc_num, V1.utilization_switch, V1.recent_kernel, V1.priority, V1.last_kernel_time) == (
        r.proc_num.offset,
        r.utilization_switch.offset,
        r.recent_kernel.offset,
        r.priority.offset,
        r.last_kernel_time.offset,
    )
    assert (V1.slot_monitorused, V1.slot_util, V1.slot_status, V1.slot_seqlock) == (
        s.monitorused.offset,
        s.device_util.offset,
        s.status.offset,
        s.seqlock.offset,
    )


def test_v0_layout_offsets_match_the_c_struct():
    r, s = kit.RegionV0, kit.SlotV0
    assert (V0.size, V0.slot_size) == (kit.C.sizeof(r), kit.C.sizeof(s))
    assert (V0.procs, V0.proc_num, V0.priority) == (r.procs.offset, r.proc_num.offset, r.priority.offset)
    assert (V0.slot_monitorused, V0.slot_util, V0.slot_status) == (
        s.monitorused.offset,
        s.device_util.offset,
        s.status.offset,
    )


def _two_procs():
    return [
        kit.Proc(pid=10, hostpid=1010, used={0: (100, 200, 300, 600), 1: (1, 2, 3, 6)}, sm_util={0: 30, 1: 5}),
        kit.Proc(pid=11, hostpid=1011, used={0: (10, 20, 30, 60)}, sm_util={0: 20}),
        kit.Proc(pid=12, hostpid=1012, status=0, used={0: (9, 9, 9, 999)}),  # exited: not counted
    ]


@pytest.mark.parametrize("version", ["v1", "v0"])
def test_reads_usage_limits_and_utilisation(tmp_path, version):
    path = kit.write(
        tmp_path / "r.cache",
        version=version,
        uuids=("GPU-a", "GPU-b"),
        limits=(2 * GiB, GiB),
        sm_limits=(30, 40),
        procs=_two_procs(),
        priority=0,
        recent_kernel=2,
        last_kernel_time=1234,
    )
    r = read_region(path)
    assert r.layout == version
    assert r.uuids == ("GPU-a", "GPU-b") and r.limits == (2 * GiB, GiB) and r.sm_limits == (30, 40)
    assert [p.pid for p in r.procs] == [10, 11]
    assert r.used(0).total == 660 and r.used(0).context == 110 and r.used(0).module == 220 and r.used(0).buffer == 330
    assert r.used(1).total == 6
    assert (r.sm_util(0), r.sm_util(1)) == (50, 5)
    assert (r.priority, r.recent_kernel, r.utilization_switch) == (0, 2, 1)
    assert r.last_kernel_time == (1234 if version == "v1" else 0)
    assert r.hostpids() == (1010, 1011)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(magic=0), "bad magic 0"),
        (dict(major=2), "unsupported major version 2"),
    ],
)
def test_rejects_untrusted_headers(tmp_path, bad, message):
    path = kit.write(tmp_path / "r.cache", **bad)
    with pytest.raises(RegionError, match=message):
        read_region(path)


@pytest.mark.parametrize("size", [0, 5, 12, 4096, V0.size - 1])
def test_rejects_truncated_files(tmp_path, size):
    path = tmp_path / "r.cache"
    path.write_bytes(kit.build()[:size])
    with pytest.raises(RegionError) as err:
        read_region(str(path))
    assert str(path) in str(err.value)


def test_file_between_v0_and_v1_size_is_read_as_v0_only_if_it_is_one(tmp_path):
    """A v1 file cut short lands in the v0 size range: its numbers must not be trusted as v1."""
    path = tmp_path / "r.cache"
    path.write_bytes(kit.build(procs=_two_procs())[: V1.size - 100])
    r = read_region(str(path))
    assert r.layout == "v0"  # HAMi's rule; the reading is bounded by the v0 size, no crash


def test_counts_are_clamped(tmp_path):
    path = kit.write(tmp_path / "r.cache", device_num=1 << 40, proc_num=5000, uuids=("GPU-a",))
    r = read_region(path)
    assert len(r.uuids) == 16 and r.proc_num_raw == 5000
    path = kit.write(tmp_path / "s.cache", proc_num=-7)
    assert read_region(path).procs == ()
    assert MAX_PROCS == 1024


def test_non_utf8_uuid_is_dropped(tmp_path):
    path = kit.write(tmp_path / "r.cache", uuids=(b"\xff\xfe-bad", "GPU-ok"), limits=(1, 2))
    assert read_region(path).uuids == ("", "GPU-ok")


def test_missing_file_is_a_region_error(tmp_path):
    with pytest.raises(RegionError, match="cannot open"):
        read_region(str(tmp_path / "nope.cache"))


def test_write_int32_changes_only_that_field(tmp_path):
    path = kit.write(tmp_path / "r.cache", recent_kernel=2, utilization_switch=1)
    before = open(path, "rb").read()
    write_int32(path, "utilization_switch", 0)
    write_int32(path, "recent_kernel", -1)
    after = open(path, "rb").read()
    r = read_region(path)
    assert (r.utilization_switch, r.recent_kernel) == (0, -1)
    diff = [i for i in range(len(before)) if before[i] != after[i]]
    assert all(V1.utilization_switch <= i < V1.priority for i in diff)


def test_write_int32_refuses_a_replaced_file(tmp_path):
    path = tmp_path / "r.cache"
    path.write_bytes(struct.pack("<iii", 1, 1, 2) + bytes(V1.size))
    with pytest.raises(RegionError, match="bad magic"):
        write_int32(str(path), "recent_kernel", -1)


def _slot_passes(monkeypatch, path, edits):
    """Serve the n-th read of the slot array with ``edits[n]`` applied (a writer between reads).

    Each edit maps (slot, field) to a value; fields are ``seq``, ``context`` and ``total`` of device
    0. The last edit repeats. Returns the list of reads made, for counting.
    """
    import hami.monitor.region as region

    real = os.pread
    reads = []

    def pread(fd, size, offset):
        data = real(fd, size, offset)
        if offset != V1.procs or size % V1.slot_size:
            return data
        buf = bytearray(data)
        for (slot, name), value in edits[min(len(reads), len(edits) - 1)].items():
            base = slot * V1.slot_size
            at = {"seq": V1.slot_seqlock, "context": 8, "total": 8 + 32}[name]
            struct.pack_into("<Q", buf, base + at, value)
        reads.append(offset)
        return bytes(buf)

    monkeypatch.setattr(region.os, "pread", pread)
    return reads


def test_a_slot_read_mid_update_is_taken_from_a_pass_its_sequence_brackets(tmp_path, monkeypatch):
    """One pass alone cannot show a torn slot: its sequence is read after its data. The writer
    went 2 -> 3 -> 4 during the first pass (context old, total new, sequence even again); the
    reading must come from a pass whose sequence is the same before and after it."""
    path = kit.write(tmp_path / "r.cache", procs=[kit.Proc(pid=10, used={0: (100, 0, 0, 100)})])
    old_context_new_total = {(0, "seq"): 4, (0, "context"): 100, (0, "total"): 300}
    settled = {(0, "seq"): 4, (0, "context"): 300, (0, "total"): 300}
    reads = _slot_passes(monkeypatch, path, [old_context_new_total, settled])
    r = read_region(path)
    assert (r.used(0).context, r.used(0).total) == (300, 300)
    assert len(reads) == 2


def test_a_slot_kept_mid_update_costs_a_bounded_number_of_reads(tmp_path, monkeypatch):
    """A container that keeps every sequence odd (or its writer died mid-update) buys at most
    2 + 3 reads of the slot array per region, not retries per slot; the slot's last reading is kept."""
    procs = [kit.Proc(pid=10 + i, used={0: (1, 0, 0, 1)}) for i in range(50)]
    path = kit.write(tmp_path / "r.cache", procs=procs)
    reads = _slot_passes(monkeypatch, path, [{(i, "seq"): 7 for i in range(50)}])
    r = read_region(path)
    assert len(reads) == 5 and len(r.procs) == 50 and r.used(0).total == 50


def test_slots_that_never_move_are_read_twice(tmp_path, monkeypatch):
    path = kit.write(tmp_path / "r.cache", procs=_two_procs())
    reads = _slot_passes(monkeypatch, path, [{}])
    assert read_region(path).used(0).total == 660 and len(reads) == 2
