"""The DRA driver's pure parts: ResourceSlice devices, DeviceClasses, claim -> CDI spec, checkpoint."""

import json

import pytest

from hami.node.nvml import PhysicalGPU
from hami.draplugin.checkpoint import Checkpoint, CheckpointError
from hami.dra.model import (
    DRIVER,
    MIB,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    SHARE_CLASS,
    WHOLE_CLASS,
    SliceSettings,
    device_classes,
    resource_slice,
    semver,
)
from hami.draplugin.prepare import Options, Paths, PrepareError, cdi_spec, plan, response_devices

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
U1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GPUS = [
    PhysicalGPU(
        1,
        U1,
        "NVIDIA A100-SXM4-40GB",
        40960,
        "0000:5e:00.0",
        1,
        numa_node=1,
        pcie_root="pci0000:5d",
        compute_capability="8.0",
    ),
    PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 0),  # no NUMA, root or capability known
]


def test_slice_publishes_each_gpu_with_attributes_capacities_and_policies():
    s = SliceSettings(split_count=4, default_cores=20, driver_version="550.54.15", mig_capable=frozenset({U1}))
    sl = resource_slice("node-a", GPUS, s, generation=3)
    spec = sl["spec"]
    assert sl["metadata"]["name"] == f"node-a-{DRIVER}"
    assert spec["driver"] == DRIVER and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]  # index order, not input order
    t4, a100 = spec["devices"]
    assert t4["allowMultipleAllocations"] is True
    assert t4["attributes"] == {
        "model": {"string": "Tesla T4"},
        "type": {"string": "NVIDIA-Tesla T4"},
        "uuid": {"string": U0},
        "index": {"int": 0},
        "numa": {"int": 0},
        "migCapable": {"bool": False},
        "taskPriority": {"bool": True},
        "corePolicy": {"bool": True},
        "driverVersion": {"version": "550.54.15"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
    }
    assert a100["attributes"]["migCapable"] == {"bool": True}
    assert {k: v for k, v in a100["attributes"].items() if k not in t4["attributes"]} == {
        "cudaComputeCapability": {"version": "8.0.0"},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:5d"},
    }
    assert a100["attributes"]["type"] == {"string": "NVIDIA A100-SXM4-40GB"}
    mem = t4["capacity"]["memory"]
    assert mem["value"] == str(15360 * MIB)
    assert mem["requestPolicy"] == {
        "default": str(15360 * MIB),
        "validRange": {"min": "1Mi", "max": str(15360 * MIB), "step": "1Mi"},
    }
    assert t4["capacity"]["cores"] == {
        "value": "100",
        "requestPolicy": {"default": "20", "validRange": {"min": "0", "max": "100"}},
    }
    assert t4["capacity"]["shares"] == {"value": "4", "requestPolicy": {"default": "1", "validValues": ["1"]}}


@pytest.mark.parametrize(
    "text,want",
    [
        ("550.54.15", "550.54.15"),
        ("535.104.05", "535.104.5"),  # a leading zero is not semver
        ("580.159.04", "580.159.4"),  # NVML on an H200 node
        ("8.6", "8.6.0"),
        ("12", "12.0.0"),
        (" 9.0\n", "9.0.0"),
        ("", None),
        (None, None),
        ("unknown", None),
        ("1.2.3.4", None),
        ("550.54.15-beta", None),
        ("9" * 70, None),  # beyond the API server's 64 characters
    ],
)
def test_versions_become_semver_or_nothing(text, want):
    assert semver(text) == want


def gpu(**facts):
    return PhysicalGPU(0, U0, "Tesla T4", 15360, facts.pop("bus_id", "0000:3b:00.0"), 0, **facts)


@pytest.mark.parametrize(
    "facts,name,want",
    [
        ({"numa_node": 0}, NUMA_NODE, {"int": 0}),
        ({"numa_node": 3}, NUMA_NODE, {"int": 3}),
        ({"numa_node": None}, NUMA_NODE, None),
        ({"numa_node": -1}, NUMA_NODE, None),  # no NUMA affinity: would match every such device
        ({"numa_node": 1024}, NUMA_NODE, None),
        ({"pcie_root": "pci0000:3a"}, PCIE_ROOT, {"string": "pci0000:3a"}),
        ({"pcie_root": "pci0001:00"}, PCIE_ROOT, {"string": "pci0001:00"}),
        ({"pcie_root": None}, PCIE_ROOT, None),
        ({"pcie_root": "0000:3a:00.0"}, PCIE_ROOT, None),
        ({"pcie_root": "platform"}, PCIE_ROOT, None),
        ({"bus_id": "0000:3b:00.0"}, PCI_BUS_ID, {"string": "0000:3b:00.0"}),
        ({"bus_id": "0000:3B:00.0"}, PCI_BUS_ID, None),  # not the sysfs form
        ({"bus_id": "00000000:3b:00.0"}, PCI_BUS_ID, None),  # NVML's form
        ({"bus_id": ""}, PCI_BUS_ID, None),
        ({"compute_capability": "9.0"}, "cudaComputeCapability", {"version": "9.0.0"}),
        ({"compute_capability": None}, "cudaComputeCapability", None),
        ({"compute_capability": "sm_90"}, "cudaComputeCapability", None),
    ],
)
def test_each_typed_attribute_is_published_only_when_well_formed(facts, name, want):
    attrs = resource_slice("n", [gpu(**facts)], SliceSettings())["spec"]["devices"][0]["attributes"]
    assert attrs.get(name) == want
    assert attrs["numa"] == {"int": 0}  # the registration's value stays, for claims written for it


@pytest.mark.parametrize("version,want", [("550.54.15", {"version": "550.54.15"}), ("", None), ("r550", None)])
def test_driver_version_is_a_version_attribute_or_left_out(version, want):
    attrs = resource_slice("n", [gpu()], SliceSettings(driver_version=version))["spec"]["devices"][0]["attributes"]
    assert attrs.get("driverVersion") == want


def test_a_gpu_without_the_optional_facts_gets_the_plain_attributes():
    """The simulator's GPUs come from a registration: no bus id, root, NUMA node or capability."""

    class Registered:
        index, uuid, model, memory_mib, numa = 0, U0, "Tesla T4", 15360, 1

    attrs = resource_slice("n", [Registered()], SliceSettings())["spec"]["devices"][0]["attributes"]
    assert sorted(attrs) == ["corePolicy", "index", "migCapable", "model", "numa", "taskPriority", "type", "uuid"]


def test_slice_applies_scaling_and_leaves_out_unhealthy_gpus():
    s = SliceSettings(memory_scaling=1.5, core_scaling=2.0)
    spec = resource_slice("n", GPUS, s, unhealthy=frozenset({U0}))["spec"]
    assert [d["name"] for d in spec["devices"]] == ["gpu-1"]
    assert spec["devices"][0]["capacity"]["memory"]["value"] == str(61440 * MIB)
    assert spec["devices"][0]["capacity"]["cores"]["value"] == "200"


@pytest.mark.parametrize(
    "field,value",
    [("split_count", 0), ("min_memory_mib", 0), ("default_cores", -1), ("memory_scaling", 0), ("core_scaling", -1.0)],
)
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SliceSettings(**{field: value})


def test_gpu_smaller_than_the_minimum_share_is_refused_by_name():
    with pytest.raises(ValueError, match=U0):
        resource_slice("n", GPUS, SliceSettings(min_memory_mib=20000))


def test_device_classes_share_and_whole_with_optional_extended_resource():
    share, whole, mig = device_classes()
    assert (share["metadata"]["name"], whole["metadata"]["name"]) == (SHARE_CLASS, WHOLE_CLASS)
    assert mig["metadata"]["name"] == "mig.gpu.hami.io"
    assert share["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.hami.io" && !("profile" in device.attributes["gpu.hami.io"])'}}
    ]
    assert share["spec"]["config"][0]["opaque"]["parameters"]["isolation"] == "hami-core"
    assert whole["spec"]["config"][0]["opaque"]["parameters"]["isolation"] == "none"
    assert "extendedResourceName" not in share["spec"]
    share, whole, _ = device_classes("nvidia.com/gpu")
    assert share["spec"]["extendedResourceName"] == "nvidia.com/gpu" and "extendedResourceName" not in whole["spec"]


# ----------------------------------------------------------------------------- prepare


def claim(results, config=(), uid="uid-1", allocated=True):
    c = {"metadata": {"namespace": "ns", "name": "c1", "uid": uid}, "status": {}}
    if allocated:
        c["status"]["allocation"] = {"devices": {"results": list(results), "config": list(config)}}
    return c


def result(device="gpu-0", pool="node-a", request="gpu", memory="3000Mi", cores="30", driver=DRIVER, share="s-1"):
    r = {
        "request": request,
        "driver": driver,
        "pool": pool,
        "device": device,
        "shareID": share,
        "consumedCapacity": {"shares": "1"},
    }
    if memory is not None:
        r["consumedCapacity"]["memory"] = memory
    if cores is not None:
        r["consumedCapacity"]["cores"] = cores
    return r


CLASS_SHARE = {
    "source": "FromClass",
    "requests": ["gpu"],
    "opaque": {
        "driver": DRIVER,
        "parameters": {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig", "isolation": "hami-core"},
    },
}
CLASS_WHOLE = {
    **CLASS_SHARE,
    "opaque": {**CLASS_SHARE["opaque"], "parameters": {**CLASS_SHARE["opaque"]["parameters"], "isolation": "none"}},
}
PATHS = Paths(hook_path="/usr/local", cdi_dir="/var/run/cdi")


def env_of(spec):
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


def test_share_becomes_libvgpu_env_and_mounts_in_one_cdi_device():
    p = plan(
        claim([result(), result(device="gpu-1", memory="5000Mi", share="s-2"), result(pool="node-b")], [CLASS_SHARE]),
        "node-a",
        GPUS,
        SliceSettings(),
    )
    spec = cdi_spec(p, PATHS, Options(libcuda_log_level="2", core_policy="force"))
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "gpu.hami.io/claim"
    assert spec["devices"][0]["name"] == "uid-1"
    env = env_of(spec)
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{U0},{U1}"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "5000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/usr/local/vgpu/") and env[
        "CUDA_DEVICE_MEMORY_SHARED_CACHE"
    ].endswith(".cache")
    assert env["LIBCUDA_LOG_LEVEL"] == "2" and env["GPU_CORE_UTILIZATION_POLICY"] == "force"
    assert env["CUDA_OVERSUBSCRIBE"] == ""  # empty: unset to libvgpu, and no pod's value survives
    mounts = {m["containerPath"]: m for m in spec["devices"][0]["containerEdits"]["mounts"]}
    assert mounts["/etc/ld.so.preload"]["hostPath"] == "/usr/local/vgpu/ld.so.preload"
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    assert mounts["/usr/local/vgpu/libvgpu.so"]["hostPath"] == "/usr/local/vgpu/libvgpu.so"
    assert mounts["/usr/local/vgpu"]["hostPath"] == "/usr/local/vgpu/claims/uid-1"
    assert "rw" in mounts["/usr/local/vgpu"]["options"]
    assert mounts["/tmp/vgpulock"]["hostPath"] == "/tmp/vgpulock" and "ro" in mounts["/tmp/vgpulock"]["options"]
    devices = response_devices(p)
    assert devices == [
        {
            "request_names": ["gpu"],
            "pool_name": "node-a",
            "device_name": "gpu-0",
            "cdi_device_ids": ["gpu.hami.io/claim=uid-1"],
            "share_id": "s-1",
        },
        {
            "request_names": ["gpu"],
            "pool_name": "node-a",
            "device_name": "gpu-1",
            "cdi_device_ids": [],
            "share_id": "s-2",
        },
    ]


def test_each_gpu_of_a_claim_gets_its_own_memory_and_core_share():
    """Two GPUs consumed differently: two memory limits and two core shares (the first GPU's
    share on every GPU used to be all libvgpu was told)."""
    results = [result(memory="3000Mi", cores="30"), result(device="gpu-1", memory="5000Mi", cores="60", share="s-2")]
    env = env_of(cdi_spec(plan(claim(results), "node-a", GPUS, SliceSettings()), PATHS, Options()))
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{U0},{U1}"
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("3000m", "5000m")
    assert (env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_1"]) == ("30", "60")
    assert env["CUDA_DEVICE_SM_LIMIT"] == "60"  # the largest share: an indexed one only lowers it


def test_equal_shares_keep_the_single_unindexed_core_share():
    results = [result(cores="30"), result(device="gpu-1", memory="5000Mi", cores="30", share="s-2")]
    env = env_of(cdi_spec(plan(claim(results), "node-a", GPUS, SliceSettings()), PATHS, Options()))
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert not any(v for k, v in env.items() if k.startswith("CUDA_DEVICE_SM_LIMIT_"))  # all empty: unset


def test_gpus_are_numbered_in_the_nodes_index_order_not_the_results_order():
    """The container enumerates its GPUs in PCI order (the node's NVML index order), whatever
    order kube-scheduler wrote the results in: gpu-1's limits must not land on gpu-0."""
    results = [result(device="gpu-1", memory="5000Mi", cores="60", request="b"), result(request="a", share="s-2")]
    p = plan(claim(results), "node-a", GPUS, SliceSettings())
    env = env_of(cdi_spec(p, PATHS, Options()))
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{U0},{U1}"
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_0"]) == ("3000m", "30")
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_1"], env["CUDA_DEVICE_SM_LIMIT_1"]) == ("5000m", "60")
    assert [d["device_name"] for d in response_devices(p)] == ["gpu-1", "gpu-0"]  # the kubelet's list keeps its order


def test_two_results_on_one_gpu_are_one_visible_gpu_holding_their_sum():
    results = [result(request="a", cores="20"), result(request="b", memory="1000Mi", cores="10", share="s-2")]
    env = env_of(cdi_spec(plan(claim(results), "node-a", GPUS, SliceSettings()), PATHS, Options()))
    assert env["NVIDIA_VISIBLE_DEVICES"] == U0
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4000m" and env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_1"] == ""  # set empty, which libvgpu reads as unset


def test_same_claim_gives_the_same_shared_region_and_another_claim_another():
    a = env_of(cdi_spec(plan(claim([result()]), "node-a", GPUS, SliceSettings()), PATHS, Options()))
    b = env_of(cdi_spec(plan(claim([result()]), "node-a", GPUS, SliceSettings()), PATHS, Options()))
    c = env_of(cdi_spec(plan(claim([result()], uid="uid-2"), "node-a", GPUS, SliceSettings()), PATHS, Options()))
    assert a["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == b["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert a["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != c["CUDA_DEVICE_MEMORY_SHARED_CACHE"]


def test_no_consumed_capacity_means_the_whole_memory_and_default_cores():
    p = plan(claim([result(memory=None, cores=None)]), "node-a", GPUS, SliceSettings(default_cores=10))
    env = env_of(cdi_spec(p, PATHS, Options(memory_oversubscribe=True)))
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "15360m" and env["CUDA_DEVICE_SM_LIMIT"] == "10"
    assert env["CUDA_OVERSUBSCRIBE"] == "true"


def test_whole_gpu_class_gets_no_libvgpu():
    p = plan(claim([result(memory=None, cores=None)], [CLASS_WHOLE]), "node-a", GPUS, SliceSettings())
    edits = cdi_spec(p, PATHS, Options())["devices"][0]["containerEdits"]
    assert edits == {"env": [f"NVIDIA_VISIBLE_DEVICES={U0}"]}


@pytest.mark.parametrize("klass", [CLASS_SHARE, CLASS_WHOLE])
def test_driver_mounts_reach_every_claim_of_either_class(klass):
    from hami.node.layout import parse_driver_mount

    paths = Paths(
        hook_path="/usr/local",
        driver_mounts=(parse_driver_mount("/opt/drv:/usr/local/nvidia"), parse_driver_mount("/var/run/state:rw")),
    )
    p = plan(claim([result(memory=None, cores=None)], [klass]), "node-a", GPUS, SliceSettings())
    mounts = {m["containerPath"]: m for m in cdi_spec(p, paths, Options())["devices"][0]["containerEdits"]["mounts"]}
    assert mounts["/usr/local/nvidia"]["hostPath"] == "/opt/drv" and "ro" in mounts["/usr/local/nvidia"]["options"]
    assert mounts["/var/run/state"]["hostPath"] == "/var/run/state" and "rw" in mounts["/var/run/state"]["options"]


@pytest.mark.parametrize(
    "c,match",
    [
        (claim([], allocated=False), "status.allocation is not set"),
        (claim([result(pool="node-b")]), "no device of driver gpu.hami.io on node node-a"),
        (claim([result(driver="other.example.com")]), "no device of driver"),
        (claim([result(device="gpu-7")]), r"results\[0\].device='gpu-7': node node-a has no such GPU"),
        (claim([result(memory="lots")]), "consumedCapacity.memory"),
        (claim([result()], [CLASS_WHOLE]), "whole-GPU class must not ask for part of the memory"),
        (
            claim(
                [result()],
                [
                    {
                        **CLASS_SHARE,
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": "gpu.hami.io/v1alpha1",
                                "kind": "GpuConfig",
                                "isolation": "maybe",
                            },
                        },
                    }
                ],
            ),
            "isolation='maybe'",
        ),
        (
            claim([result()], [{**CLASS_SHARE, "opaque": {"driver": DRIVER, "parameters": {"kind": "Other"}}}]),
            "apiVersion gpu.hami.io/v1alpha1 kind GpuConfig",
        ),
    ],
)
def test_bad_claims_are_refused_naming_the_field(c, match):
    with pytest.raises(PrepareError, match=match):
        plan(c, "node-a", GPUS, SliceSettings())


# found by make fuzz (DRA gRPC prepare): amounts no allocator could have written became limits;
# consumedCapacity memory "16106127361" (one byte over the T4's 15360 MiB) gave a 15360m limit,
# "0" gave "0m" (no limit at all to libvgpu), cores -1 gave CUDA_DEVICE_SM_LIMIT=-1
@pytest.mark.parametrize(
    "memory,cores,match",
    [
        (str(15360 * MIB + 1), "30", r"consumedCapacity.memory=16106127361: outside the GPU's 1048576..16106127360"),
        ("0", "30", r"consumedCapacity.memory=0: outside"),
        ("1048575", "30", r"consumedCapacity.memory=1048575: outside"),
        ("-1Mi", "30", r"consumedCapacity.memory=-1048576: outside"),
        ("3000Mi", "-1", r"consumedCapacity.cores=-1: outside the GPU's 0..100"),
        ("3000Mi", "101", r"consumedCapacity.cores=101: outside"),
    ],
)
def test_consumed_amounts_outside_the_gpu_are_refused(memory, cores, match):
    with pytest.raises(PrepareError, match=match) as err:
        plan(claim([result(memory=memory, cores=cores)]), "node-a", GPUS, SliceSettings())
    assert "ResourceClaim ns/c1" in str(err.value)
    edge = plan(claim([result(memory=f"{15360 * MIB}", cores="100")]), "node-a", GPUS, SliceSettings())
    assert (edge.shares[0].memory_mib, edge.shares[0].cores) == (15360, 100)


# found by make fuzz (DRA gRPC prepare): a configuration or result of the wrong type failed the claim
# with "'str' object has no attribute 'get'" (naming no claim), and a numeric shareID was written to
# the checkpoint and then failed every answer to the kubelet
@pytest.mark.parametrize(
    "config,match",
    [
        ([{"requests": 5, "opaque": CLASS_SHARE["opaque"]}], "configuration requests must be a list, got 5"),
        ([{"opaque": {"driver": DRIVER, "parameters": ["x"]}}], "configuration parameters must be an object"),
    ],
)
def test_configuration_of_the_wrong_type_is_refused_naming_the_claim(config, match):
    with pytest.raises(PrepareError, match=match) as err:
        plan(claim([result()], config), "node-a", GPUS, SliceSettings())
    assert "ResourceClaim ns/c1" in str(err.value)


def test_fields_of_the_wrong_type_are_read_as_missing_or_refused_by_name():
    assert plan(claim([result()], [{"opaque": "x"}]), "node-a", GPUS, SliceSettings()).isolation == "hami-core"
    assert plan(claim([result()], {"a": 1}), "node-a", GPUS, SliceSettings()).isolation == "hami-core"
    assert plan(claim([result(share=7)]), "node-a", GPUS, SliceSettings()).shares[0].share_id is None
    with pytest.raises(PrepareError, match=r"results\[0\].device=\['gpu-0'\]: node node-a has no such GPU"):
        plan(claim([result(device=["gpu-0"])]), "node-a", GPUS, SliceSettings())
    odd = {**claim([result()]), "metadata": ["x"]}
    assert plan(odd, "node-a", GPUS, SliceSettings()).uid == ""


def test_claim_configuration_overrides_the_class():
    mine = {"source": "FromClaim", "requests": [], "opaque": CLASS_WHOLE["opaque"]}
    p = plan(claim([result(memory=None)], [mine, CLASS_SHARE]), "node-a", GPUS, SliceSettings())
    assert p.isolation == "none"


# ----------------------------------------------------------------------------- checkpoint


ENTRY = {"devices": [{"device_name": "gpu-0"}], "cdi_file": "/var/run/cdi/gpu.hami.io-u.json", "cdi_spec": {}}


def test_checkpoint_survives_reopen_and_removes(tmp_path):
    cp = Checkpoint(tmp_path / "state" / "checkpoint.json")
    assert cp.get("u") is None
    cp.put("u", ENTRY)
    again = Checkpoint(tmp_path / "state" / "checkpoint.json")
    assert again.get("u") == ENTRY and again.uids() == ["u"]
    assert again.remove("u") is not None and again.remove("u") is None
    assert Checkpoint(tmp_path / "state" / "checkpoint.json").uids() == []
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["checkpoint.json"]  # no temporary left


@pytest.mark.parametrize(
    "text,match",
    [
        ("{not json", "not JSON"),
        (json.dumps({"version": 9, "claims": {}}), "version 9"),
        (json.dumps([1]), "expected"),
        # found by make fuzz: bytes that are not UTF-8 raised UnicodeDecodeError out of the agent's start
        (b'{"version": 1, "claims": {"\xff\xfe": 1}}', "not UTF-8"),
        # found by make fuzz: a record of the wrong shape loaded, then failed every prepare with a TypeError
        (json.dumps({"version": 1, "claims": {"u": 5}}), "claim 'u': expected an object"),
        (json.dumps({"version": 1, "claims": {"u": {**ENTRY, "cdi_file": None}}}), "claim 'u': cdi_file"),
        (json.dumps({"version": 1, "claims": {"u": {**ENTRY, "devices": ["x"]}}}), "claim 'u': devices"),
        (json.dumps({"version": 1, "claims": {"u": {**ENTRY, "cdi_spec": []}}}), "claim 'u': cdi_spec"),
    ],
)
def test_corrupt_checkpoint_is_an_error_naming_the_file(tmp_path, text, match):
    path = tmp_path / "checkpoint.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CheckpointError, match=match) as err:
        Checkpoint(path)
    assert str(path) in str(err.value)


async def test_the_agent_refuses_to_start_on_a_damaged_checkpoint_and_leaves_it(tmp_path, capsys):
    """Found by make fuzz: a CheckpointError escaped the agent's start as a traceback. It is one line
    and exit status 2 now, before the API server is called (no kubeconfig is needed to see it)."""
    import argparse

    from hami.draplugin.command import EXIT_CONFIG, _serve

    (tmp_path / "checkpoint.json").write_bytes(b'{"version": 1, "claims": {"u": 5}}')
    args = argparse.Namespace(state_dir=str(tmp_path), kubeconfig=str(tmp_path / "no-such-kubeconfig"))
    assert await _serve(args, None, [], SliceSettings()) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("hami dra: refusing to start: checkpoint ") and "Traceback" not in err
    assert (tmp_path / "checkpoint.json").read_bytes() == b'{"version": 1, "claims": {"u": 5}}'
