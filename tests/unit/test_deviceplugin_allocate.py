"""Allocate decisions without I/O: pod choice, container popping, env and mounts."""

import pytest

from hami.core.codec import encode_pod_devices
from hami.core.types import ContainerDevice
from hami.deviceplugin import allocate as A
from hami.node import contract
from hami.node.layout import HookPaths, parse_driver_mount
from hami.node.settings import NodeSettings

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
U1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
NODE_GPUS = (U0, U1)  # this node's GPUs (pop_next refuses any other)


def dev(uuid, mem, cores=0):
    return ContainerDevice(uuid, "NVIDIA", mem, cores)


def pod(annotation, containers=("main",), name="p", **extra):
    ann = {A.TO_ALLOCATE: annotation} if annotation is not None else {}
    ann.update(extra.pop("annotations", {}))
    ctrs = tuple(c if isinstance(c, A.ContainerView) else A.ContainerView(c) for c in containers)
    return A.PodView("ns", name, "uid-" + name, ann, ctrs, **extra)


def test_parse_node_lock_forms():
    assert A.parse_node_lock("2026-01-02T03:04:05Z,ns,p") == A.NodeLock("2026-01-02T03:04:05Z", "ns", "p")
    assert A.parse_node_lock("2026-01-02T03:04:05Z") is None  # legacy: names no pod
    assert A.parse_node_lock("garbage,ns,p") is None
    assert A.parse_node_lock(None) is None


def test_lock_owner_check():
    p = pod("")
    assert A.lock_owned_by("2026-01-02T03:04:05Z,ns,p", p)
    assert not A.lock_owned_by("2026-01-02T03:04:05Z,ns,other", p)


def candidate(name, **ann):
    base = {A.BIND_TIME: "1", A.BIND_PHASE: "allocating", A.VGPU_NODE: "n1"}
    base.update(ann)
    return pod(encode_pod_devices([[dev(U0, 10)]]), name=name, annotations=base, phase="Pending")


def test_choose_pending_single_candidate():
    assert A.choose_pending([candidate("a"), candidate("b", **{A.VGPU_NODE: "n2"})], "n1").name == "a"


def test_choose_pending_refuses_to_guess():
    with pytest.raises(A.AllocationError, match=r"2 pods waiting .*\(ns/a, ns/b\); refusing to guess"):
        A.choose_pending([candidate("b"), candidate("a")], "n1")


def test_choose_pending_none():
    with pytest.raises(A.AllocationError, match="no pod is waiting"):
        A.choose_pending([candidate("a", **{A.BIND_PHASE: "failed"})], "n1")


def test_pop_skips_empty_entries_and_blanks_the_taken_one():
    p = pod(encode_pod_devices([[], [dev(U0, 3000)], [dev(U1, 5000)]]), containers=("init", "a", "b"))
    pending = A.pending_devices(p)
    g = A.pop_next(p, pending, 1, gpus=NODE_GPUS)
    assert (g.index, g.container.name, g.devices) == (1, "a", (dev(U0, 3000),))
    assert A.remainder(pending) == f";;{U1},NVIDIA,5000,0:;"
    assert not A.all_done(pending)
    g2 = A.pop_next(p, pending, 1, gpus=NODE_GPUS)
    assert g2.container.name == "b" and A.all_done(pending) and A.remainder(pending) == ";;;"


def test_pop_count_mismatch_names_pod_and_container():
    p = pod(encode_pod_devices([[dev(U0, 1), dev(U1, 1)]]))
    with pytest.raises(A.AllocationError, match=r"pod ns/p: container 'main' has 2 GPU\(s\).*asked for 1"):
        A.pop_next(p, A.pending_devices(p), 1, gpus=NODE_GPUS)


def test_pop_when_nothing_left():
    p = pod(";")
    with pytest.raises(A.AllocationError, match="no container left"):
        A.pop_next(p, A.pending_devices(p), 1, gpus=NODE_GPUS)


@pytest.mark.parametrize("value", ["GPU-x,NVIDIA;", "GPU-x,NVIDIA,lots,0:;"])
def test_garbled_annotation_is_a_clear_error(value):
    with pytest.raises(A.AllocationError, match=f"pod ns/p: annotation {A.TO_ALLOCATE}=.* is invalid"):
        A.pending_devices(pod(value))


def test_missing_annotation():
    with pytest.raises(A.AllocationError, match="is missing"):
        A.pending_devices(pod(None))


def test_more_entries_than_containers():
    with pytest.raises(A.AllocationError, match="2 container entries but the pod has 1"):
        A.pending_devices(pod(encode_pod_devices([[dev(U0, 1)], [dev(U1, 1)]])))


@pytest.mark.parametrize(("stored", "env"), [("1k", "1000"), ("0", "0"), ("1", "1")])
def test_a_priority_in_the_api_servers_canonical_form_reaches_libvgpu_as_a_number(stored, env):
    ctr = A.ContainerView("main", limits={"nvidia.com/priority": stored})
    p = pod("", containers=(ctr,))
    r = A.build_response(p, A.Grant(0, ctr, (dev(U0, 3000, 30),)), NodeSettings(), HookPaths("/opt/h", "/tmp/vl"))
    assert r.envs["CUDA_TASK_PRIORITY"] == env


def test_a_priority_that_is_no_number_is_an_allocation_error_naming_it():
    ctr = A.ContainerView("main", limits={"nvidia.com/priority": "high"})
    p = pod("", containers=(ctr,))
    with pytest.raises(A.AllocationError, match="container 'main' limits.nvidia.com/priority"):
        A.build_response(p, A.Grant(0, ctr, (dev(U0, 3000, 30),)), NodeSettings(), HookPaths("/opt/h", "/tmp/vl"))


def test_response_env_and_mounts():
    paths = HookPaths("/opt/h", "/tmp/vl")
    settings = NodeSettings(device_memory_scaling=2.0, libcuda_log_level="1", gpu_core_policy="force")
    ctr = A.ContainerView("main", limits={"nvidia.com/priority": "0"})
    p = pod("", containers=(ctr,))
    r = A.build_response(p, A.Grant(0, ctr, (dev(U0, 3000, 30), dev(U1, 4000, 50))), settings, paths)
    cache = contract.container_region(paths, "uid-p", "main")
    assert r.envs == {
        "NVIDIA_VISIBLE_DEVICES": f"{U0},{U1}",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "4000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": cache,
        "CUDA_OVERSUBSCRIBE": "true",
        "LIBCUDA_LOG_LEVEL": "1",
        "CUDA_TASK_PRIORITY": "0",
        "GPU_CORE_UTILIZATION_POLICY": "force",
    }
    assert r.cache_dir == "/opt/h/vgpu/containers/uid-p_main"
    assert [(m.container_path, m.host_path, m.read_only) for m in r.mounts] == [
        ("/opt/h/vgpu/libvgpu.so", "/opt/h/vgpu/libvgpu.so", True),
        ("/opt/h/vgpu", "/opt/h/vgpu/containers/uid-p_main", False),
        ("/tmp/vgpulock", "/tmp/vl", True),  # libvgpu never writes there: no shared writable host dir
        ("/opt/h/vgpu/hami-grant.env", "/opt/h/vgpu/containers/uid-p_main/hami-grant.env", True),
        ("/etc/ld.so.preload", "/opt/h/vgpu/ld.so.preload", True),
    ]
    # the grant file: every variable libvgpu reads, the grant's values, the rest empty
    grant = dict(line.split("=", 1) for line in r.grant.splitlines())
    assert set(grant) == set(contract.libvgpu_names())
    granted = {k: v for k, v in r.envs.items() if k in grant}
    assert {k: v for k, v in grant.items() if v} == {**granted, "HAMI_GRANT_DEVICES": f"{U0},{U1}"}
    assert grant["CUDA_DEVICE_MEMORY_LIMIT"] == "" and grant["CUDA_DEVICE_SM_LIMIT_0"] == ""


def test_the_grant_file_keeps_the_pod_specs_policy_and_no_other_value():
    # the webhook writes GPU_CORE_UTILIZATION_POLICY=disable into a pod of a namespace allowed to
    # switch it off; an envFrom's or image's value of any libvgpu variable is never read
    ctr = A.ContainerView("main", env={"GPU_CORE_UTILIZATION_POLICY": "disable", "CUDA_DEVICE_SM_LIMIT_0": "100"})
    r = A.build_response(pod("", containers=(ctr,)), A.Grant(0, ctr, (dev(U0, 3000, 30),)), NodeSettings(), HookPaths())
    grant = dict(line.split("=", 1) for line in r.grant.splitlines())
    assert grant["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    assert grant["CUDA_DEVICE_SM_LIMIT_0"] == "" and grant["CUDA_DEVICE_SM_LIMIT"] == "30"
    with pytest.raises(ValueError, match="line break"):
        contract.grant_file({"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/x\nCUDA_DEVICE_MEMORY_LIMIT=0"}, {})


def test_response_defaults_and_disable_control():
    ctr = A.ContainerView("c", env={"CUDA_DISABLE_CONTROL": "true"})
    r = A.build_response(
        pod("", containers=(ctr,)),
        A.Grant(0, ctr, (dev(U0, 1000),)),
        NodeSettings(disable_core_limit=True),
        HookPaths(),
    )
    assert (
        "CUDA_OVERSUBSCRIBE" not in r.envs and "CUDA_TASK_PRIORITY" not in r.envs and "LIBCUDA_LOG_LEVEL" not in r.envs
    )
    assert r.envs["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    assert "/etc/ld.so.preload" not in [m.container_path for m in r.mounts]


def test_cache_file_is_deterministic_and_per_container():
    region = contract.container_region
    assert region(HookPaths(), "u", "a") == region(HookPaths(), "u", "a") != region(HookPaths(), "u", "b")


def test_preferred_ids_follow_the_annotation():
    from hami.deviceplugin.allocator import preferred_ids

    avail = [f"{U0}-0", f"{U0}-1", f"{U1}-0", f"{U1}-1"]
    assert preferred_ids(avail, [], 1, [U1]) == [f"{U1}-0"]
    assert preferred_ids(avail, [f"{U0}-1"], 2, [U1]) == [f"{U0}-1", f"{U1}-0"]
    assert preferred_ids(avail, [], 2, []) == avail[:2]  # no pending pod: plain order
    assert preferred_ids(avail, [], 2, [U1, U1]) == [f"{U1}-0", f"{U0}-0"]  # one ID per physical GPU, then fill


def test_driver_mounts_go_to_every_gpu_container():
    driver = (
        parse_driver_mount("/home/kubernetes/bin/nvidia:/usr/local/nvidia"),
        parse_driver_mount("/var/run/fake-state:rw"),
    )
    paths = HookPaths("/opt/h", "/tmp/vl", driver)
    ctr = A.ContainerView("main")
    r = A.build_response(pod("", containers=(ctr,)), A.Grant(0, ctr, (dev(U0, 1000),)), NodeSettings(), paths)
    got = [(m.container_path, m.host_path, m.read_only) for m in r.mounts]
    assert got[:2] == [
        ("/usr/local/nvidia", "/home/kubernetes/bin/nvidia", True),
        ("/var/run/fake-state", "/var/run/fake-state", False),
    ]
    assert ("/etc/ld.so.preload", "/opt/h/vgpu/ld.so.preload", True) in got  # libvgpu's mounts stay
    # a MIG container (its GPU is cut, not shared) needs the driver too
    mig = A.build_response(
        pod("", containers=(ctr,)),
        A.Grant(0, ctr, (dev(U0, 1000),)),
        NodeSettings(operating_mode="mig"),
        paths,
        ["MIG-1"],
    )
    assert [m.container_path for m in mig.mounts][:2] == ["/usr/local/nvidia", "/var/run/fake-state"]


def test_mig_container_gets_its_mig_device_and_the_profile_memory_limit():
    paths = HookPaths("/opt/h", "/tmp/vl")
    ctr = A.ContainerView("main")
    grant = A.Grant(0, ctr, (dev(U0, 19968), dev(U0, 4864)))
    r = A.build_response(
        pod("", containers=(ctr,)), grant, NodeSettings(operating_mode="mig"), paths, ["MIG-aaaa", "MIG-bbbb"]
    )
    assert r.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-aaaa,MIG-bbbb"
    assert (r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], r.envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("19968m", "4864m")
    assert r.envs["CUDA_DEVICE_SM_LIMIT"] == "100"  # the instance's SMs are all its own
    assert ("/etc/ld.so.preload", "/opt/h/vgpu/ld.so.preload", True) in [
        (m.container_path, m.host_path, m.read_only) for m in r.mounts
    ]
    with pytest.raises(A.AllocationError, match="1 instance"):
        A.build_response(pod("", containers=(ctr,)), grant, NodeSettings(operating_mode="mig"), paths, ["MIG-aaaa"])


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "expected HOST"),
        ("a:b:c:d", "expected HOST"),
        ("relative/dir", "host path 'relative/dir' is not absolute"),
        ("/host:lib", "container path 'lib' is not absolute"),
    ],
)
def test_driver_mount_is_checked(text, message):
    with pytest.raises(ValueError, match=f"--driver-mount '{text}': .*{message}"):
        parse_driver_mount(text)
