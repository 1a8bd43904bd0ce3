"""MIG through DRA: static instances and dynamic placements as ResourceSlice devices (KEP-4815
shared counters), the simulator allocating them as kube-scheduler's allocator does (an exclusive
device, counters consumed across the devices of one GPU), and prepare/unprepare making and
destroying dynamic instances with the extender path's MigManager, restart safe."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from hami.node.mig import Checkpoint as MigCheckpoint, MigManager
from hami.dra import fit
from hami.dra.model import (
    MAX_SLICE_DEVICES,
    MIG_CLASS,
    SHARE_CLASS,
    GpuMig,
    MigProfileSpec,
    SliceSettings,
    StaticInstance,
    device_classes,
    mig_devices,
    resource_slices,
    slice_name,
)
from hami.draplugin.checkpoint import Checkpoint
from hami.draplugin.plugin import Driver
from hami.draplugin.prepare import Paths, PrepareError, plan
from hami.node.nvml import GpuProfile, Instance, MigError

A100 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
T4 = "GPU-bbbbbbbb-0000-4000-8000-000000000001"
H100 = "GPU-cccccccc-0000-4000-8000-000000000002"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa: int = 0


GPUS = [Gpu(0, A100, "NVIDIA A100-SXM4-40GB", 40960), Gpu(1, T4, "Tesla T4", 15360)]

#: the A100-40GB's plain profiles as NVML gives them (start, size in memory slices)
A100_PROFILES = (
    GpuProfile("1g.5gb", 19, 1, 7, 14, 4864, tuple((s, 1) for s in range(7))),
    GpuProfile("2g.10gb", 14, 2, 3, 28, 9856, ((0, 2), (2, 2), (4, 2))),
    GpuProfile("3g.20gb", 9, 3, 2, 42, 19968, ((0, 4), (4, 4))),
    GpuProfile("4g.20gb", 5, 4, 1, 56, 19968, ((0, 4),)),
    GpuProfile("7g.40gb", 0, 7, 1, 98, 40192, ((0, 8),)),
)


def specs(profiles=A100_PROFILES) -> tuple[MigProfileSpec, ...]:
    full = max(p.sms for p in profiles)
    return tuple(MigProfileSpec(p.name, p.memory_mb, -(-p.sms * 100 // full), p.slices, p.placements) for p in profiles)


DYNAMIC = {A100: GpuMig(True, specs())}


def slices(mig=DYNAMIC, gpus=GPUS, **kw):
    return resource_slices("n1", gpus, SliceSettings(split_count=4), mig=mig, **kw)


# ------------------------------------------------------------------ the slices


def test_dynamic_mig_is_one_device_per_placement_consuming_the_gpus_memory_slices():
    devs, counters = slices()
    assert devs["metadata"]["name"] == slice_name("n1") and counters["metadata"]["name"] == slice_name("n1", 1)
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in (devs, counters)] == [2, 2]
    assert "devices" not in counters["spec"] and "sharedCounters" not in devs["spec"]  # the API's rule
    [cs] = counters["spec"]["sharedCounters"]
    assert cs == {"name": "gpu-0-slices", "counters": {f"slice-{k}": {"value": "1"} for k in range(8)}}
    names = [d["name"] for d in devs["spec"]["devices"]]
    assert names[0] == "gpu-1"  # the T4 stays a shared GPU; the A100 in MIG mode is not one
    assert "gpu-0" not in names and len(names) == 1 + 7 + 3 + 2 + 1 + 1
    three = next(d for d in devs["spec"]["devices"] if d["name"] == "gpu-0-3g-20gb-4")
    assert three["consumesCounters"] == [
        {"counterSet": "gpu-0-slices", "counters": {f"slice-{k}": {"value": "1"} for k in (4, 5, 6, 7)}}
    ]
    assert three["attributes"]["profile"] == {"string": "3g.20gb"}
    assert three["attributes"]["parentUUID"] == {"string": A100} and "uuid" not in three["attributes"]
    assert three["capacity"]["memory"]["value"] == str(19968 * 1024 * 1024)
    assert "allowMultipleAllocations" not in three


def test_static_mig_instances_are_devices_with_their_mig_uuid_and_no_counters():
    mig = {A100: GpuMig(False, instances=(StaticInstance(3, "3g.20gb", 4, 4, "MIG-x", 19968, 43),))}
    [only] = slices(mig)
    assert only["spec"]["pool"]["resourceSliceCount"] == 1
    d = next(d for d in only["spec"]["devices"] if d["name"] == "gpu-0-mig-3")
    assert d["attributes"]["uuid"] == {"string": "MIG-x"} and "consumesCounters" not in d


def test_a_slice_with_counter_consuming_devices_holds_at_most_64():
    gpus = [Gpu(i, f"GPU-{i:08x}-0000-4000-8000-000000000000", "NVIDIA A100-SXM4-40GB", 40960) for i in range(8)]
    mig = {g.uuid: GpuMig(True, specs()) for g in gpus}
    out = slices(mig, gpus)
    device_slices = [s for s in out if "devices" in s["spec"]]
    assert all(len(s["spec"]["devices"]) <= MAX_SLICE_DEVICES for s in device_slices)
    assert sum(len(s["spec"]["devices"]) for s in device_slices) == 8 * 14
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in out} == {len(out)}
    assert len({s["metadata"]["name"] for s in out}) == len(out)


def test_share_and_whole_classes_never_select_a_mig_device_and_the_mig_class_only_those():
    devices = list(fit.devices_of(slices()).values())
    for cls in device_classes():
        name = cls["metadata"]["name"]
        picked = {d.device for d in devices if not fit.refused_by(d, fit.Request("r", name, 1, {}))}
        if name == MIG_CLASS:
            assert picked == {d.device for d in devices if d.device != "gpu-1"}
        else:
            assert picked == {"gpu-1"}, name


# ------------------------------------------------------------------ the simulator


def mig_claim(name: str, profile: str, count: int = 1) -> fit.ClaimAsk:
    sel = fit.compile_selector(f'device.attributes["gpu.hami.io"].profile == "{profile}"')
    return fit.ClaimAsk(name, [fit.Request("mig", MIG_CLASS, count, {}, (sel,))])


def test_the_simulator_consumes_counters_across_the_devices_of_one_gpu():
    devices = list(fit.devices_of(slices()).values())
    got = []
    for i, profile in enumerate(["3g.20gb", "3g.20gb", "3g.20gb", "1g.5gb"]):
        found = fit.allocate_claims(devices, [mig_claim(f"c{i}", profile)])
        if found.picks is None:
            got.append(None)
            continue
        [[p]] = found.picks
        assert "consumedCapacity" not in p.result()  # kube-scheduler records none for exclusive devices
        fit.commit([p], f"c{i}")
        got.append(p.device.device)
    # slice order: the first placement free of the others' memory slices; then nothing overlaps
    assert got == ["gpu-0-3g-20gb-0", "gpu-0-3g-20gb-4", None, None]


def test_the_simulator_never_gives_one_request_two_overlapping_placements():
    devices = list(fit.devices_of(slices()).values())
    found = fit.allocate_claims(devices, [mig_claim("c", "2g.10gb", count=3)])
    assert [p.device.device for p in found.picks[0]] == ["gpu-0-2g-10gb-0", "gpu-0-2g-10gb-2", "gpu-0-2g-10gb-4"]
    found = fit.allocate_claims(devices, [mig_claim("c", "2g.10gb", count=4)])
    assert found.picks is None


def test_allocated_mig_claims_count_against_the_counters_and_explain_says_why():
    claim = {
        "metadata": {"namespace": "ns", "name": "held", "uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "mig", "driver": "gpu.hami.io", "pool": "n1", "device": "gpu-0-7g-40gb-0"}]
                }
            }
        },
    }
    devices = fit.usage(slices(), [claim])
    one = devices[("n1", "gpu-0-1g-5gb-0")]
    assert not one.counters_fit()
    r = fit.Request("mig", MIG_CLASS, 1, {})
    assert "overlapping" in fit.device_why(one, r)
    assert "allocated to another claim" in fit.device_why(devices[("n1", "gpu-0-7g-40gb-0")], r)
    assert fit.allocate_claims(list(devices.values()), [mig_claim("c", "1g.5gb")]).picks is None


# ------------------------------------------------------------------ prepare / unprepare


class FakeMig:
    """MigNvml's calls on one fake A100, in memory: GPU instances with a compute instance each."""

    def __init__(self) -> None:
        self.live: dict[int, Instance] = {}
        self.fail_create = False

    def enable(self, uuid):
        pass

    def profiles(self, uuid):
        return list(A100_PROFILES)

    def instances(self, uuid):
        return sorted(self.live.values(), key=lambda i: i.gi)

    def create_gi(self, uuid, profile, start):
        if self.fail_create:
            raise MigError(f"GPU {uuid}: cannot create a {profile.name} instance at {start}")
        for i in self.live.values():
            if i.start < start + dict(profile.placements)[start] and start < i.start + i.size:
                raise MigError(f"GPU {uuid}: placement {start} overlaps GPU instance {i.gi}")
        gi = max(self.live, default=0) + 1
        self.live[gi] = Instance(gi, profile.name, start, dict(profile.placements)[start])
        return gi

    def create_ci(self, uuid, gi, profile):
        i = self.live[gi]
        self.live[gi] = Instance(gi, i.profile, i.start, i.size, 0, f"MIG-{gi:04d}")
        return 0, f"MIG-{gi:04d}"

    def destroy(self, uuid, gi):
        self.live.pop(gi, None)


def allocated(uid: str, *devices: str) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": f"c-{uid}", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "mig", "driver": "gpu.hami.io", "pool": "n1", "device": d} for d in devices]
                }
            }
        },
    }


class Node:
    def __init__(self, root: Path, nvml: FakeMig, claims: dict) -> None:
        self.root, self.nvml, self.claims = root, nvml, claims

    def driver(self) -> Driver:
        async def read(ns, name):
            return self.claims[name]

        mig = MigManager(self.nvml, MigCheckpoint(self.root / "state" / "mig.json"), [A100])
        return Driver(
            "n1",
            GPUS,
            SliceSettings(),
            Checkpoint(self.root / "state" / "checkpoint.json"),
            read,
            Paths(hook_path=str(self.root / "hook"), cdi_dir=str(self.root / "cdi")),
            migs=mig_devices(GPUS, DYNAMIC),
            mig=mig,
        )


def env_of(root: Path, uid: str) -> list[str]:
    spec = json.loads((root / "cdi" / f"gpu.hami.io-{uid}.json").read_text())
    return spec["devices"][0]["containerEdits"]["env"]


def test_prepare_makes_the_instances_and_unprepare_destroys_them(tmp_path):
    nvml = FakeMig()
    node = Node(tmp_path, nvml, {"c-u1": allocated("u1", "gpu-0-3g-20gb-4", "gpu-0-1g-5gb-0")})
    driver = node.driver()
    driver.recover_mig()
    devices = asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    assert [d["device_name"] for d in devices] == ["gpu-0-3g-20gb-4", "gpu-0-1g-5gb-0"]
    assert [(i.profile, i.start) for i in nvml.instances(A100)] == [("3g.20gb", 4), ("1g.5gb", 0)]
    env = env_of(tmp_path, "u1")
    assert "NVIDIA_VISIBLE_DEVICES=MIG-0001,MIG-0002" in env
    assert not any(e.startswith("CUDA_DEVICE_MEMORY_LIMIT") for e in env)  # no libvgpu on a MIG instance
    assert asyncio.run(driver.prepare("ns", "c-u1", "u1")) == devices  # a retry: the same, nothing new
    assert len(nvml.live) == 2
    asyncio.run(driver.unprepare("ns", "c-u1", "u1"))
    assert nvml.live == {} and not (tmp_path / "cdi" / "gpu.hami.io-u1.json").exists()


def test_a_failed_creation_leaves_no_instance_and_names_the_claim(tmp_path):
    nvml = FakeMig()
    node = Node(tmp_path, nvml, {"c-u1": allocated("u1", "gpu-0-1g-5gb-0", "gpu-0-2g-10gb-0")})
    driver = node.driver()
    with pytest.raises(PrepareError, match="claim ns/c-u1: .*overlaps"):
        asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    assert nvml.live == {} and driver.checkpoint.get("u1") is None


def test_a_restart_destroys_what_no_prepared_claim_holds_and_keeps_the_rest(tmp_path):
    nvml = FakeMig()
    claims = {"c-u1": allocated("u1", "gpu-0-3g-20gb-0"), "c-u2": allocated("u2", "gpu-0-3g-20gb-4")}
    node = Node(tmp_path, nvml, claims)
    driver = node.driver()
    asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    asyncio.run(driver.prepare("ns", "c-u2", "u2"))
    driver.checkpoint.remove("u2")  # as if the plugin died after making u2's instance, before recording it
    nvml.live[9] = Instance(9, "1g.5gb", 6, 1, 0, "MIG-stray")  # nobody's
    again = node.driver()  # a new process: both checkpoints read from disk
    done = again.recover_mig()
    assert [(i.profile, i.start) for i in nvml.instances(A100)] == [("3g.20gb", 0)]
    assert len(done) == 2
    asyncio.run(again.unprepare("ns", "c-u1", "u1"))
    assert nvml.live == {}


def test_plan_refuses_a_claim_mixing_mig_devices_and_gpu_shares():
    claim = allocated("u1", "gpu-0-3g-20gb-0", "gpu-1")
    with pytest.raises(PrepareError, match="mix"):
        plan(claim, "n1", GPUS, SliceSettings(), mig_devices(GPUS, DYNAMIC))
    with pytest.raises(PrepareError, match="no such GPU"):
        plan(allocated("u1", "gpu-0"), "n1", GPUS, SliceSettings(), mig_devices(GPUS, DYNAMIC))


def test_without_dynamic_mig_on_the_node_prepare_refuses_a_placement(tmp_path):
    async def read(ns, name):
        return allocated("u1", "gpu-0-3g-20gb-0")

    d = Driver(
        "n1",
        GPUS,
        SliceSettings(),
        Checkpoint(tmp_path / "cp.json"),
        read,
        Paths(hook_path=str(tmp_path / "hook"), cdi_dir=str(tmp_path / "cdi")),
        migs=mig_devices(GPUS, DYNAMIC),
    )
    with pytest.raises(PrepareError, match="dynamic MIG is off"):
        asyncio.run(d.prepare("ns", "c", "u1"))


def test_share_class_is_still_the_first_class():
    assert device_classes()[0]["metadata"]["name"] == SHARE_CLASS


# ------------------------------------------------------------------ the publisher and the agent


class SliceApi:
    """KubeClient's get/request over the ResourceSlices by path (PATCH stores, DELETE removes)."""

    def __init__(self) -> None:
        self.stored: dict[str, dict] = {}
        self.deleted: list[str] = []

    async def get(self, path, **query):
        from hami.kube.client import KubeError

        if path not in self.stored:
            raise KubeError("GET", path, 404, "not found")
        return self.stored[path]

    async def request(self, method, path, query=None, body=None, content_type=None):
        if method == "DELETE":
            self.deleted.append(path.rsplit("/", 1)[-1])
            return self.stored.pop(path)
        assert method == "PATCH"
        self.stored[path] = json.loads(json.dumps(body))
        return self.stored[path]


def test_the_publisher_writes_every_part_keeps_the_generation_and_drops_parts_no_longer_needed():
    from hami.draplugin.publisher import publish_slice

    api, s = SliceApi(), SliceSettings(split_count=4)
    first = asyncio.run(publish_slice(api, "n1", GPUS, s, mig=DYNAMIC))
    assert len(api.stored) == 2 and first["spec"]["pool"]["generation"] == 1
    asyncio.run(publish_slice(api, "n1", GPUS, s, mig=DYNAMIC))
    assert {o["spec"]["pool"]["generation"] for o in api.stored.values()} == {1}
    sick = asyncio.run(publish_slice(api, "n1", GPUS, s, frozenset({A100}), taint="NoSchedule", mig=DYNAMIC))
    assert sick["spec"]["pool"]["generation"] == 2
    assert all(d.get("taints") for d in sick["spec"]["devices"] if d["name"].startswith("gpu-0-"))
    assert {o["spec"]["pool"]["generation"] for o in api.stored.values()} == {2}
    plain = asyncio.run(publish_slice(api, "n1", GPUS, s))  # MIG mode off: one slice again
    assert api.deleted == [slice_name("n1", 1)] and list(api.stored) == [
        f"/apis/resource.k8s.io/v1/resourceslices/{slice_name('n1')}"
    ]
    assert plain["spec"]["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}


def test_static_layout_reads_the_instances_of_gpus_in_mig_mode(monkeypatch):
    from hami.draplugin import command
    from hami.node import nvml
    from hami.node.settings import NodeSettings

    class Mig:
        def profiles(self, uuid):
            return list(A100_PROFILES)

        def instances(self, uuid):
            return [Instance(1, "3g.20gb", 0, 4, 0, "MIG-1"), Instance(2, "1g.5gb", 6, 1)]  # 2: no compute instance

    monkeypatch.setattr(nvml, "MigNvml", Mig)
    monkeypatch.setattr(nvml, "mig_enabled", lambda uuid: uuid == A100)
    layout = command.mig_layout(NodeSettings(mig_strategy="mixed"), GPUS)
    assert layout == {A100: GpuMig(False, instances=(StaticInstance(1, "3g.20gb", 0, 4, "MIG-1", 19968, 43),))}
    assert command.mig_layout(NodeSettings(), GPUS) == {}
    with pytest.raises(ValueError, match="migstrategy 'mixed' cannot be combined with operatingmode 'mig'"):
        command.mig_layout(NodeSettings(mig_strategy="mixed", operating_mode="mig"), GPUS)


def test_a_static_instance_is_handed_over_by_its_mig_uuid_and_nothing_is_made(tmp_path):
    mig = {A100: GpuMig(False, instances=(StaticInstance(3, "3g.20gb", 4, 4, "MIG-static-3", 19968, 43),))}

    async def read(ns, name):
        return allocated("u9", "gpu-0-mig-3")

    d = Driver(
        "n1",
        GPUS,
        SliceSettings(),
        Checkpoint(tmp_path / "cp.json"),
        read,
        Paths(hook_path=str(tmp_path / "hook"), cdi_dir=str(tmp_path / "cdi")),
        migs=mig_devices(GPUS, mig),
    )
    [dev] = asyncio.run(d.prepare("ns", "c-u9", "u9"))
    assert dev["device_name"] == "gpu-0-mig-3"
    assert "NVIDIA_VISIBLE_DEVICES=MIG-static-3" in env_of(tmp_path, "u9")
    asyncio.run(d.unprepare("ns", "c-u9", "u9"))
    assert d.checkpoint.get("u9") is None


def test_after_a_reboot_a_claims_instances_are_made_again_and_its_unprepare_spares_the_new_ones(tmp_path):
    """Dynamic instances do not survive a reboot and NVML hands their ids out again: the recorded
    answer named a dead MIG device, and the claim's unprepare destroyed, by id, the instance
    another claim got since. Found by an adversarial review."""
    nvml = FakeMig()
    claims = {"c-u1": allocated("u1", "gpu-0-3g-20gb-4"), "c-u2": allocated("u2", "gpu-0-1g-5gb-0")}
    node = Node(tmp_path, nvml, claims)
    asyncio.run(node.driver().prepare("ns", "c-u1", "u1"))
    assert "NVIDIA_VISIBLE_DEVICES=MIG-0001" in env_of(tmp_path, "u1")
    nvml.live.clear()  # the reboot
    after = node.driver()
    after.recover_mig()
    asyncio.run(after.prepare("ns", "c-u2", "u2"))  # gets GPU instance 1 again
    assert [(i.gi, i.profile) for i in nvml.instances(A100)] == [(1, "1g.5gb")]
    asyncio.run(after.prepare("ns", "c-u1", "u1"))  # the kubelet prepares u1 again after its restart
    assert sorted((i.profile, i.start) for i in nvml.instances(A100)) == [("1g.5gb", 0), ("3g.20gb", 4)]
    [mine] = [i for i in nvml.instances(A100) if i.profile == "3g.20gb"]
    assert f"NVIDIA_VISIBLE_DEVICES={mine.mig_uuid}" in env_of(tmp_path, "u1")
    asyncio.run(after.unprepare("ns", "c-u1", "u1"))
    assert [(i.gi, i.profile) for i in nvml.instances(A100)] == [(1, "1g.5gb")]  # u2's is kept


def test_an_unprepare_without_an_entry_destroys_instances_a_cut_short_prepare_made(tmp_path):
    """The kubelet's deadline cancels a Prepare while its thread still makes the instance: no
    entry is recorded, and the unprepare that follows must not leave the instance (its placement
    would be held until the agent restarts)."""
    nvml = FakeMig()
    claims = {"c-u1": allocated("u1", "gpu-0-3g-20gb-4"), "c-u2": allocated("u2", "gpu-0-3g-20gb-4")}
    node = Node(tmp_path, nvml, claims)
    driver = node.driver()
    asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    driver.checkpoint.remove("u1")  # as if the answer never came: made, not recorded
    asyncio.run(driver.unprepare("ns", "c-u1", "u1"))
    assert nvml.live == {}
    asyncio.run(driver.prepare("ns", "c-u2", "u2"))  # the placement is free again
    assert [(i.profile, i.start) for i in nvml.instances(A100)] == [("3g.20gb", 4)]


def test_an_instance_whose_mig_device_nvml_cannot_name_is_still_destroyed(tmp_path):
    """NVML answers "" for the MIG device of an instance without its compute instance (or when
    the handle lookup fails): the instance is still the entry's by profile and placement, and
    is destroyed (found by the regression review: it was orphaned)."""
    nvml = FakeMig()
    node = Node(tmp_path, nvml, {"c-u1": allocated("u1", "gpu-0-3g-20gb-4")})
    driver = node.driver()
    asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    [gi] = list(nvml.live)
    i = nvml.live[gi]
    nvml.live[gi] = Instance(i.gi, i.profile, i.start, i.size, None, "")
    asyncio.run(driver.unprepare("ns", "c-u1", "u1"))
    assert nvml.live == {}
