"""Which container of a pod gets a claim's CDI device: the kubelet matches the Device entries of
NodePrepareResources to a container's ``resources.claims[].request`` by ``request_names``
(kubelet ``ClaimInfo.cdiDevicesAsList``: an entry whose names contain the container's request, or
every entry when the container names none). A real Driver and checkpoint; the API server is a dict."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from hami.dra.model import DRIVER, SliceSettings
from hami.draplugin.checkpoint import Checkpoint
from hami.draplugin.plugin import DRAService, Driver, dra_pb
from hami.draplugin.prepare import Paths
from hami.node.nvml import PhysicalGPU

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
U1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GPUS = [
    PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 0),
    PhysicalGPU(1, U1, "Tesla T4", 15360, "0000:3c:00.0", 0),
]


def result(request, device, share):
    return {
        "request": request,
        "driver": DRIVER,
        "pool": "node-a",
        "device": device,
        "shareID": share,
        "consumedCapacity": {"memory": "1000Mi", "cores": "10"},
    }


def claim(name, uid, *results):
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def cdi_for_container(devices, request=""):
    """The CDI device IDs the kubelet hands a container that names ``request`` of the claim."""
    return [
        i
        for d in devices
        if not request or not d["request_names"] or request in d["request_names"]
        for i in d["cdi_device_ids"]
    ]


@pytest.fixture
def root():
    d = Path(tempfile.mkdtemp(prefix="drarv", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make(root, claims):
    async def read(namespace, name):
        return json.loads(json.dumps(claims[name]))

    paths = Paths(hook_path=str(root / "usr"), lock_dir=str(root / "lock"), cdi_dir=str(root / "cdi"))
    return Driver("node-a", GPUS, SliceSettings(), Checkpoint(root / "state" / "checkpoint.json"), read, paths)


async def test_a_container_naming_the_second_request_gets_the_claims_cdi_device(root):
    claims = {"two": claim("two", "u-two", result("a", "gpu-0", "s1"), result("b", "gpu-1", "s2"))}
    devices = await make(root, claims).prepare("ns", "two", "u-two")
    assert cdi_for_container(devices, "a") == ["gpu.hami.io/claim=u-two"]
    # before: the CDI device was on the claim's first entry only, and container b got nothing
    assert cdi_for_container(devices, "b") == ["gpu.hami.io/claim=u-two"]
    assert cdi_for_container(devices) == ["gpu.hami.io/claim=u-two"] * 2  # the runtime applies it once


async def test_two_results_of_one_request_carry_the_cdi_device_once(root):
    claims = {"c": claim("c", "u-c", result("gpu", "gpu-0", "s1"), result("gpu", "gpu-1", "s2"))}
    devices = await make(root, claims).prepare("ns", "c", "u-c")
    assert [d["cdi_device_ids"] for d in devices] == [["gpu.hami.io/claim=u-c"], []]


async def test_a_first_available_result_is_named_by_its_request(root):
    claims = {"sub": claim("sub", "u-sub", result("gpu/big", "gpu-0", "s1"))}
    driver = make(root, claims)
    out = await DRAService(driver).NodePrepareResources(
        dra_pb.NodePrepareResourcesRequest(claims=[dra_pb.Claim(namespace="ns", name="sub", uid="u-sub")]), None
    )
    got = out.claims["u-sub"]
    assert got.error == ""
    devices = [{"request_names": list(d.request_names), "cdi_device_ids": list(d.cdi_device_ids)} for d in got.devices]
    # a container names the request (``gpu``), never the subrequest; before: ["gpu/big"], no match
    assert devices[0]["request_names"] == ["gpu"]
    assert cdi_for_container(devices, "gpu") == ["gpu.hami.io/claim=u-sub"]
    # the same allocation, answered from the checkpoint, is the same answer
    again = await driver.prepare("ns", "sub", "u-sub")
    assert again[0]["request_names"] == ["gpu"] and again[0]["cdi_device_ids"] == ["gpu.hami.io/claim=u-sub"]


async def test_an_entry_recorded_by_an_older_agent_is_answered_as_the_kubelet_matches(root):
    claims = {"two": claim("two", "u-two", result("a/x", "gpu-0", "s1"), result("b", "gpu-1", "s2"))}
    driver = make(root, claims)
    await driver.prepare("ns", "two", "u-two")
    entry = driver.checkpoint.get("u-two")
    # as the agent before this fix recorded it: the full request names, the CDI device on the first only
    entry["devices"][0]["request_names"], entry["devices"][0]["cdi_device_ids"] = ["a/x"], ["gpu.hami.io/claim=u-two"]
    entry["devices"][1]["cdi_device_ids"] = []
    driver.checkpoint.put("u-two", entry)
    again = await Driver(
        "node-a", GPUS, SliceSettings(), Checkpoint(root / "state" / "checkpoint.json"), driver.read_claim, driver.paths
    ).prepare("ns", "two", "u-two")
    assert [d["request_names"] for d in again] == [["a"], ["b"]]
    assert cdi_for_container(again, "a") == cdi_for_container(again, "b") == ["gpu.hami.io/claim=u-two"]


@pytest.mark.parametrize(
    "namespace, name",
    [
        ("ns", "../../../../api/v1/namespaces/kube-system/secrets/token"),
        ("kube-system/secrets/token/../../../x", "c"),
        ("ns", "c?watch=true"),
        ("", "c"),
        ("ns", ""),
        ("NS", "c"),
    ],
)
async def test_a_claim_reference_that_is_no_namespace_and_name_reads_nothing(root, namespace, name):
    asked = []

    async def read(ns, n):  # the path the agent would GET is made from these
        asked.append((ns, n))
        raise LookupError("not found")

    paths = Paths(hook_path=str(root / "usr"), lock_dir=str(root / "lock"), cdi_dir=str(root / "cdi"))
    driver = Driver("node-a", GPUS, SliceSettings(), Checkpoint(root / "state" / "checkpoint.json"), read, paths)
    out = await DRAService(driver).NodePrepareResources(
        dra_pb.NodePrepareResourcesRequest(claims=[dra_pb.Claim(namespace=namespace, name=name, uid="u-1")]), None
    )
    assert "not a Kubernetes namespace and ResourceClaim name" in out.claims["u-1"].error
    assert asked == []  # before: the agent sent the GET, e.g. of .../resourceclaims/../../../../api/v1/...
    assert driver.metrics.prepare_errors.labels("invalid_uid")._value.get() == 1
