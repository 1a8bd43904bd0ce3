"""Review of the NRI hook (deviceplugin/injection.py): the first grant served for a pod uid is the
one its containers get for the pod's life, through a new sandbox, an edited annotation and an
agent restart; the record goes with the pod."""

from __future__ import annotations

import os

from hami.deviceplugin import allocate as A
from hami.deviceplugin.injection import Injector
from hami.node.layout import HookPaths
from hami.node.nri import load
from hami.node.settings import NodeSettings

from .test_deviceplugin_injection import ALLOCATED, G0, G1, FakeKube, adjusted_env, ctr, pod_obj, sandbox

_, pb = load()
# "eval" moved from GPU-a1 to GPU-a0 with the whole GPU's memory, after the pod was bound
EDITED = f";{G0},NVIDIA,3000,30:{G1},NVIDIA,3000,30:;;{G0},NVIDIA,80000,100:;"


def hook_at(kube, tmp_path) -> Injector:
    paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
    return Injector(kube, NodeSettings(), paths, gpus=[G0, G1])


def edited_sandbox(obj, sandbox_id: str, allocated: str | None):
    sb = sandbox(obj)
    sb.id = sandbox_id
    if allocated is None:
        sb.annotations.pop(A.ALLOCATED, None)
    else:
        sb.annotations[A.ALLOCATED] = allocated
    return sb


async def test_a_restarted_container_in_a_new_sandbox_keeps_the_grant_it_was_first_given(tmp_path):
    obj = pod_obj()
    kube = FakeKube([obj])
    hook = hook_at(kube, tmp_path)
    first = await hook.create_container(sandbox(obj), ctr("eval"))
    assert adjusted_env(first)["NVIDIA_VISIBLE_DEVICES"] == G1
    # the sandbox died and the kubelet made a new one, passing the pod's annotations as they are
    # now: someone rewrote the grant since the bind
    again = await hook.create_container(edited_sandbox(obj, "sb2", EDITED), ctr("eval"))
    assert adjusted_env(again)["NVIDIA_VISIBLE_DEVICES"] == G1
    assert adjusted_env(again)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert adjusted_env(again)["CUDA_DEVICE_SM_LIMIT"] == "10"


async def test_the_first_grant_outlives_an_agent_restart(tmp_path):
    obj = pod_obj()
    await hook_at(FakeKube([obj]), tmp_path).create_container(sandbox(obj), ctr("train"))
    # a new agent (same host directory); the runtime passes no annotations, the API copy is edited
    obj["metadata"]["annotations"][A.ALLOCATED] = EDITED
    restarted = hook_at(FakeKube([obj]), tmp_path)
    again = await restarted.create_container(sandbox(obj, with_annotations=False), ctr("eval"))
    assert adjusted_env(again)["NVIDIA_VISIBLE_DEVICES"] == G1
    assert adjusted_env(again)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"


async def test_the_record_goes_with_its_sandbox_and_with_pods_the_runtime_no_longer_has(tmp_path):
    obj, other = pod_obj(), pod_obj(uid="uid-q")
    other["metadata"]["name"] = "q"
    hook = hook_at(FakeKube([obj, other]), tmp_path)
    await hook.create_container(sandbox(obj), ctr("eval"))
    await hook.create_container(edited_sandbox(obj, "sb2", ALLOCATED), ctr("eval"))  # a new sandbox
    await hook.create_container(sandbox(other), ctr("eval"))
    records = tmp_path / "hook" / "vgpu" / "nri" / "grants"
    assert sorted(os.listdir(records)) == ["uid-p", "uid-q"]
    # the old sandbox's removal (the kubelet's garbage collection) leaves the pod's record
    await hook.pod_removed(pb.PodSandbox(id="sb", uid="uid-p"))
    assert sorted(os.listdir(records)) == ["uid-p", "uid-q"]
    await hook.pod_removed(pb.PodSandbox(id="sb2", uid="uid-p"))
    assert sorted(os.listdir(records)) == ["uid-q"]
    # pod q was deleted while no hook was registered: the next synchronization forgets it
    await hook.synchronized([pb.PodSandbox(id="sb3", uid="uid-p")], [])
    assert os.listdir(records) == []
    # a pod uid that is no file name is kept in memory only
    odd = pod_obj(uid="../../etc/x")
    await hook_at(FakeKube([odd]), tmp_path).create_container(sandbox(odd), ctr("eval"))
    assert os.listdir(records) == []


async def test_a_grant_annotation_removed_after_the_first_creation_still_serves_the_first(tmp_path):
    obj = pod_obj()
    hook = hook_at(FakeKube([obj]), tmp_path)
    await hook.create_container(sandbox(obj), ctr("train"))
    del obj["metadata"]["annotations"][A.ALLOCATED]
    again = await hook.create_container(edited_sandbox(obj, "sb2", None), ctr("eval"))
    assert adjusted_env(again)["NVIDIA_VISIBLE_DEVICES"] == G1


def test_a_record_write_a_crash_cut_short_is_swept_at_synchronize(tmp_path):
    """``.<uid>.tmp`` files left by a crash mid-write were never removed (the sweep read only
    record names, which never start with a dot)."""
    from hami.deviceplugin.injection import GrantRecords

    records = GrantRecords(tmp_path)
    records.put("uid-p", "GPU-a,NVIDIA,1000,10:;", "sb-1")
    (tmp_path / ".uid-q.tmp").write_text("{")
    (tmp_path / ".not a record.tmp").write_text("")  # (not ours: left alone)
    assert records.keep_only({"uid-p"}) == 0
    assert sorted(os.listdir(tmp_path)) == [".not a record.tmp", "uid-p"]
