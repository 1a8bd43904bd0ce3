"""DRA device names kept per GPU UUID (hami.draplugin.names): a GPU that drops off the bus makes
NVML number the rest again at the agent's next start; named by index, ``gpu-3`` would then be
another physical GPU, and kube-scheduler would book the shares of the GPU the running claims sit
on a second time."""

from __future__ import annotations

import json

import pytest

from hami.dra.model import GpuMig, SliceSettings, StaticInstance, mig_devices, resource_slices
from hami.draplugin.names import FILE, NamesError, keep_names
from hami.draplugin.prepare import plan
from hami.node.nvml import PhysicalGPU

from .test_dra_priority_prepare import claim as prepare_claim
from .test_dra_priority_prepare import result as prepare_result

SETTINGS = SliceSettings(split_count=4)


def gpus(*uuids: str) -> list[PhysicalGPU]:
    """The GPUs NVML sees, numbered from 0 in this order (as after a restart)."""
    return [PhysicalGPU(i, u, "Tesla T4", 15360, f"0000:{i + 1:02x}:00.0", 0) for i, u in enumerate(uuids)]


def names(slices) -> dict[str, tuple[str, int]]:
    """device name -> (UUID attribute, index attribute) over the slices."""
    return {
        d["name"]: (d["attributes"]["uuid"]["string"], d["attributes"]["index"]["int"])
        for s in slices
        for d in s["spec"]["devices"]
    }


def test_a_first_start_names_each_gpu_by_its_nvml_index_and_records_it(tmp_path):
    out = keep_names(gpus("GPU-a", "GPU-b", "GPU-c"), tmp_path)
    assert [g.slot for g in out] == [0, 1, 2]
    assert names(resource_slices("n1", out, SETTINGS)) == {
        "gpu-0": ("GPU-a", 0),
        "gpu-1": ("GPU-b", 1),
        "gpu-2": ("GPU-c", 2),
    }
    assert json.loads((tmp_path / FILE).read_text()) == {"version": 1, "slots": {"GPU-a": 0, "GPU-b": 1, "GPU-c": 2}}


def test_a_gpu_gone_from_the_bus_does_not_move_the_others_names(tmp_path):
    keep_names(gpus("GPU-a", "GPU-b", "GPU-c", "GPU-d"), tmp_path)
    after = keep_names(gpus("GPU-a", "GPU-c", "GPU-d"), tmp_path)  # GPU-b fell off: c and d moved down
    assert names(resource_slices("n1", after, SETTINGS)) == {
        "gpu-0": ("GPU-a", 0),
        "gpu-2": ("GPU-c", 1),  # the name the running claims were booked on; NVML's index beside it
        "gpu-3": ("GPU-d", 2),
    }
    # a claim kube-scheduler allocated on gpu-2 before the restart is prepared on GPU-c, not GPU-d
    claim = prepare_claim(results=[prepare_result("gpu-2")])
    (share,) = plan(claim, "n1", after, SETTINGS).shares
    assert (share.device, share.uuid, share.index) == ("gpu-2", "GPU-c", 1)


def test_a_new_gpu_takes_its_index_when_free_else_a_number_no_gpu_ever_held(tmp_path):
    keep_names(gpus("GPU-a", "GPU-b", "GPU-c"), tmp_path)
    # GPU-b replaced by GPU-x in the same slot: index 1 is GPU-b's name, kept for it
    out = keep_names(gpus("GPU-a", "GPU-x", "GPU-c"), tmp_path)
    assert [(g.uuid, g.slot) for g in out] == [("GPU-a", 0), ("GPU-x", 3), ("GPU-c", 2)]
    # a fourth GPU added later at index 3: 3 is held (GPU-x), so 4
    out = keep_names(gpus("GPU-a", "GPU-x", "GPU-c", "GPU-y"), tmp_path)
    assert [g.slot for g in out] == [0, 3, 2, 4]
    # and GPU-b coming back keeps its own name
    out = keep_names(gpus("GPU-a", "GPU-b", "GPU-x", "GPU-c", "GPU-y"), tmp_path)
    assert [g.slot for g in out] == [0, 1, 3, 2, 4]


def test_mig_devices_and_counter_sets_follow_the_kept_name(tmp_path):
    keep_names(gpus("GPU-a", "GPU-b"), tmp_path)
    (b,) = keep_names(gpus("GPU-b"), tmp_path)  # GPU-a gone: GPU-b is NVML's 0, named gpu-1
    static = GpuMig(
        False,
        instances=(StaticInstance(profile="1g.5gb", gi=7, start=0, size=1, memory_mb=4864, core=14, mig_uuid="MIG-1"),),
    )
    assert list(mig_devices([b], {"GPU-b": static})) == ["gpu-1-mig-7"]


def test_a_dry_run_reads_the_record_but_writes_none(tmp_path):
    assert [g.slot for g in keep_names(gpus("GPU-a"), tmp_path, write=False)] == [0]
    assert not (tmp_path / FILE).exists()


@pytest.mark.parametrize(
    "text",
    [
        "{",
        '{"version": 2, "slots": {}}',
        '{"version": 1, "slots": {"GPU-a": -1}}',
        '{"version": 1, "slots": {"GPU-a": true}}',
        '{"version": 1, "slots": {"GPU-a": 0, "GPU-b": 0}}',
        '{"version": 1}',
    ],
)
def test_a_damaged_record_stops_the_agent_naming_the_file(tmp_path, text):
    (tmp_path / FILE).write_text(text)
    with pytest.raises(NamesError, match=f"device names {tmp_path / FILE}"):
        keep_names(gpus("GPU-a"), tmp_path)


def test_dynamic_mig_placements_consume_the_counter_set_of_the_kept_name(tmp_path):
    from hami.dra.model import MigProfileSpec

    keep_names(gpus("GPU-a", "GPU-b"), tmp_path)
    (b,) = keep_names(gpus("GPU-b"), tmp_path)
    dynamic = GpuMig(True, profiles=(MigProfileSpec("1g.5gb", 4864, 14, 1, ((0, 1), (1, 1))),))
    slices = resource_slices("n1", [b], SETTINGS, mig={"GPU-b": dynamic})
    sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters", [])]
    used = {
        (d["name"], c["counterSet"])
        for s in slices
        for d in s["spec"].get("devices", [])
        for c in d.get("consumesCounters", [])
    }
    assert sets == ["gpu-1-slices"]
    assert used == {("gpu-1-1g-5gb-0", "gpu-1-slices"), ("gpu-1-1g-5gb-1", "gpu-1-slices")}
