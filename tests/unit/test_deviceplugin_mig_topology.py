"""Pure parts of the node's MIG and topology code (no NVML): pair scores from link tables, the
registered MIG profiles, the MIG registration, the checkpoint's errors, and the manager's rules
against an in-memory driver (clean-up never takes an instance made after its pod list)."""

from __future__ import annotations

import pytest

from hami.core.codec import MigAllocation
from hami.core.types import MigProfile
from hami.deviceplugin.devices import DeviceState
from hami.node.nvml import PhysicalGPU
from hami.node.mig import Checkpoint, MigManager, PodRef
from hami.node.settings import NodeSettings
from hami.deviceplugin.topology import pair_scores
from hami.node.nvml import GpuLinks, GpuProfile, Instance, MigError, Topology, registered_profiles

SYSTEM, NODE, HOSTBRIDGE, MULTIPLE, SINGLE, INTERNAL = 50, 40, 30, 20, 10, 0  # NVML topology levels


def test_pair_scores_sum_pcie_and_nvlinks_and_zero_asymmetric_pairs():
    topo = Topology(
        gpus=(
            GpuLinks("a", {"b": 2}),
            GpuLinks("b", {"a": 2}),
            GpuLinks("c", {"d": 1}, switch=0),
            GpuLinks("d", {"c": 2}),
        ),
        pcie={
            ("a", "b"): SINGLE,
            ("a", "c"): HOSTBRIDGE,
            ("a", "d"): SYSTEM,
            ("b", "c"): NODE,
            ("b", "d"): MULTIPLE,
            ("c", "d"): INTERNAL,
        },
    )
    got = pair_scores(topo)
    assert got.scores["a"] == {"b": 250, "c": 30, "d": 10}
    assert got.scores["b"]["d"] == got.scores["d"]["b"] == 40
    assert got.scores["c"]["d"] == 0 and got.asymmetric == (("c", "d"),)


def test_nvswitch_links_count_the_smaller_side():
    topo = Topology(
        gpus=(GpuLinks("a", switch=18), GpuLinks("b", switch=12), GpuLinks("c")),
        pcie={("a", "b"): NODE, ("a", "c"): NODE, ("b", "c"): NODE},
    )
    s = pair_scores(topo).scores
    assert s["a"]["b"] == 20 + 1200 and s["a"]["c"] == 20  # c is not on the fabric


PROFILES = [
    GpuProfile("1g.5gb", 19, 1, 7, 14, 4864, tuple((i, 1) for i in range(7))),
    GpuProfile("1g.5gb+me", 20, 1, 1, 14, 4864, tuple((i, 1) for i in range(7))),
    GpuProfile("3g.20gb", 9, 3, 2, 42, 19968, ((0, 4), (4, 4))),
    GpuProfile("7g.40gb", 0, 7, 1, 98, 40192, ((0, 8),)),
]


def test_registered_profiles_follow_the_allowlist():
    plain = registered_profiles(PROFILES, "NVIDIA A100-SXM4-40GB", ())
    assert [(p.name, p.core) for p in plain] == [("1g.5gb", 15), ("3g.20gb", 43), ("7g.40gb", 100)]
    only = registered_profiles(PROFILES, "NVIDIA A100-SXM4-40GB", ((("A100-SXM4-40GB",), ("3g.20gb", "1g.5gb+me")),))
    assert [p.name for p in only] == ["1g.5gb+me", "3g.20gb"]
    everything = registered_profiles(PROFILES, "NVIDIA A100-SXM4-40GB", ((("H100",), ("7g.80gb",)), (("A100",), ())))
    assert len(everything) == 4


def test_mig_registration_counts_non_overlapping_placements():
    gpu = PhysicalGPU(
        0,
        "GPU-1",
        "NVIDIA A100-SXM4-40GB",
        40960,
        "0000:3b:00.0",
        0,
        registered_profiles(PROFILES, "NVIDIA A100-SXM4-40GB", ()),
    )
    [d] = DeviceState([gpu], NodeSettings(operating_mode="mig", device_memory_scaling=2)).registration()
    assert (d.mode, d.count, d.devcore, d.devmem) == ("mig", 7, 100, 40960)
    assert [p.name for p in d.mig_profiles] == ["1g.5gb", "3g.20gb", "7g.40gb"]
    assert isinstance(d.mig_profiles[0], MigProfile)


@pytest.mark.parametrize(
    "text,message",
    [
        ("{not json", "is unreadable"),
        ('{"version": 2, "entries": []}', "expected"),
        ('{"version": 1, "entries": [{"pod_uid": "u"}]}', "entry 0 is invalid"),
        # found by make fuzz: fields of the wrong type loaded, to fail later in arithmetic or NVML calls
        (
            '{"version": 1, "entries": [{"pod_uid": "u", "pod": "ns/p", "container": 0, "device": 0, '
            '"gpu_uuid": "GPU-x", "profile": "1g.10gb", "start": 0, "size": {"then": null}}]}',
            r"entry 0 is invalid \(size=\{'then': None\}\)",
        ),
        (
            '{"version": 1, "entries": [{"pod_uid": "u", "pod": "ns/p", "container": true, "device": 0, '
            '"gpu_uuid": "GPU-x", "profile": "1g.10gb", "start": 0, "size": 1, "gpu_instance_id": "7"}]}',
            r"entry 0 is invalid \(container=True, gpu_instance_id='7'\)",
        ),
    ],
)
def test_a_damaged_checkpoint_is_one_clear_error(tmp_path, text, message):
    path = tmp_path / "checkpoint.json"
    path.write_text(text)
    with pytest.raises(MigError, match=message):
        Checkpoint(path).load()


class MemoryNvml:
    """An in-memory MIG driver: one GPU with PROFILES, instances made and destroyed on request."""

    def __init__(self) -> None:
        self.live: dict[int, Instance] = {}

    def enable(self, uuid):
        pass

    def profiles(self, uuid):
        return PROFILES

    def instances(self, uuid):
        return sorted(self.live.values(), key=lambda i: i.gi)

    def create_gi(self, uuid, profile, start):
        gi = min(set(range(1, 9)) - set(self.live))
        self.live[gi] = Instance(gi, profile.name, start, dict(profile.placements)[start])
        return gi

    def create_ci(self, uuid, gi, profile):
        inst = self.live[gi]
        self.live[gi] = Instance(inst.gi, inst.profile, inst.start, inst.size, 0, f"MIG-{gi}")
        return 0, f"MIG-{gi}"

    def destroy(self, uuid, gi):
        self.live.pop(gi, None)


def _alloc(start=4, profile="3g.20gb", size=4) -> MigAllocation:
    return MigAllocation(container=0, device=0, gpu_uuid="GPU-1", profile=profile, start=start, size=size)


def test_clean_up_spares_instances_made_after_its_pod_list(tmp_path):
    nvml = MemoryNvml()
    mgr = MigManager(nvml, Checkpoint(tmp_path / "c.json"), ["GPU-1"])
    mgr.recover()
    seen = mgr.snapshot()  # the clean-up reads the pod list here...
    mgr.prepare(PodRef("new", "ns", "new"), [_alloc()])  # ...and a pod bound just after is allocated
    assert mgr.collect(set(), upto=seen) == [] and len(nvml.live) == 1
    assert len(mgr.collect(set())) == 1 and nvml.live == {}  # the next round, with a list that misses it


def test_unknown_profile_or_placement_is_refused_before_touching_the_gpu(tmp_path):
    nvml = MemoryNvml()
    mgr = MigManager(nvml, Checkpoint(tmp_path / "c.json"), ["GPU-1"])
    mgr.recover()
    with pytest.raises(MigError, match="has no MIG profile '2g.10gb'"):
        mgr.prepare(PodRef("u", "ns", "p"), [_alloc(profile="2g.10gb", start=0, size=2)])
    with pytest.raises(MigError, match="placement 2\\+4 is not one of profile 3g.20gb's"):
        mgr.prepare(PodRef("u", "ns", "p"), [_alloc(start=2)])
    with pytest.raises(MigError, match="not on this node"):
        mgr.prepare(PodRef("u", "ns", "p"), [MigAllocation(0, 0, "GPU-9", "3g.20gb", 4, 4)])
    assert nvml.live == {} and mgr.entries == {}


async def test_recovery_without_the_pod_list_keeps_unclaimed_instances(tmp_path):
    """Start-up with the API server unreachable: instances nobody claims are kept (they may
    belong to running pods whose checkpoint entries were lost); with the list they go."""
    from types import SimpleNamespace

    from hami.deviceplugin.agent import NodeAgent

    nvml = MemoryNvml()
    nvml.live[3] = Instance(3, "3g.20gb", 0, 4, 0, "MIG-3")

    class NoApi:
        async def pods_on_node(self):
            raise OSError("connection refused")

    class Api:
        async def pods_on_node(self):
            return []

    agent = SimpleNamespace(mig=MigManager(nvml, Checkpoint(tmp_path / "c.json"), ["GPU-1"]), kube=NoApi())
    await NodeAgent._recover_mig(agent)
    assert list(nvml.live) == [3]
    agent.kube = Api()
    await NodeAgent._recover_mig(agent)
    assert nvml.live == {}
