"""The DRA kubelet plugin's claim lifecycle across what the kubelet and the node can do to it: a
claim allocated again under its UID while the plugin still holds it, files left by a prepare that
died before its checkpoint entry, an unprepare whose checkpoint write failed, a UID twice in one
request, and the per-claim lock table. A real Driver, checkpoint and files; the API server is a
dict."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hami.dra.model import CONFIG_API_VERSION, CONFIG_KIND, DRIVER, SliceSettings
from hami.draplugin.checkpoint import Checkpoint, CheckpointError
from hami.draplugin.plugin import DRAService, Driver, dra_pb
from hami.draplugin.prepare import Paths, PrepareError
from hami.draplugin.sweep import sweep_once
from hami.kube.client import KubeError
from hami.node.nvml import PhysicalGPU

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
U1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GPUS = [
    PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 0),
    PhysicalGPU(1, U1, "Tesla T4", 15360, "0000:3c:00.0", 0),
]
PREFIX = "/apis/resource.k8s.io/v1/namespaces/"


def result(device="gpu-0", memory="1000Mi", cores="10", share="s1", pool="node-a", **extra):
    r = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device, **extra}
    if share:
        r["shareID"] = share
    r["consumedCapacity"] = {"memory": memory, "cores": cores}
    return r


class Api:
    """The API server's claims (namespace "ns"), read as the Driver and the sweep read them."""

    def __init__(self):
        self.claims = {}
        self.fail: Exception | None = None
        self.during_read = None  # awaited inside a read, before it answers (a race)

    def set(self, name, uid, *results, config=None, allocated=True):
        status = {"allocation": {"devices": {"results": list(results), "config": config or []}}} if allocated else {}
        self.claims[name] = {"metadata": {"namespace": "ns", "name": name, "uid": uid}, "status": status}

    async def get(self, path, **query):
        assert path.startswith(PREFIX), path
        _, _, name = path[len(PREFIX) :].split("/")
        if self.fail is not None:
            raise self.fail
        answer = json.loads(json.dumps(self.claims[name])) if name in self.claims else None
        if self.during_read is not None:
            hook, self.during_read = self.during_read, None
            await hook()
        if answer is None:
            raise KubeError("GET", path, 404, '{"kind":"Status","reason":"NotFound"}')
        return answer

    async def read_claim(self, namespace, name):
        return await self.get(f"{PREFIX}{namespace}/resourceclaims/{name}")


@pytest.fixture
def root():
    d = Path(tempfile.mkdtemp(prefix="dralc", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make(root, api):
    paths = Paths(hook_path=str(root / "usr"), lock_dir=str(root / "lock"), cdi_dir=str(root / "cdi"))
    cp = Checkpoint(root / "state" / "checkpoint.json")
    return Driver("node-a", GPUS, SliceSettings(), cp, api.read_claim, paths), paths


def env(paths, uid):
    spec = json.loads(Path(paths.cdi_file(uid)).read_text())
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


def files(paths, uid):
    return [Path(paths.cdi_file(uid)), Path(paths.claim_dir(uid)), Path(paths.claim_record(uid))]


# 1. a claim allocated again under the same UID


async def test_a_claim_allocated_again_to_another_gpu_gets_the_new_gpu_and_limits(root):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result("gpu-0", "1000Mi", "10", "s1"))
    [dev] = await driver.prepare("ns", "c", "u1")
    assert dev["device_name"] == "gpu-0"
    (Path(paths.claim_dir("u1")) / "region.cache").write_text("the old allocation's region")
    # the kubelet lost track and never unprepared; the claim was deallocated and allocated again
    api.set("c", "u1", result("gpu-1", "8000Mi", "50", "s2"))

    [dev] = await driver.prepare("ns", "c", "u1")

    assert (dev["device_name"], dev["share_id"]) == ("gpu-1", "s2")
    e = env(paths, "u1")
    assert e["NVIDIA_VISIBLE_DEVICES"] == U1 and e["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m"
    assert e["CUDA_DEVICE_SM_LIMIT"] == "50"
    assert driver.checkpoint.get("u1")["devices"] == [dev]
    # the old allocation's region went with it: the new one starts fresh, with the new grant file
    left = list(Path(paths.claim_dir("u1")).iterdir())
    assert [p.name for p in left] == ["hami-grant.env"]
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=8000m\n" in left[0].read_text()
    assert driver.metrics.registry.get_sample_value("hami_dra_prepared_claims") == 1


async def test_new_consumed_amounts_on_the_same_gpu_are_applied(root):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result("gpu-0", "1000Mi", "10", share=""))
    await driver.prepare("ns", "c", "u1")
    api.set("c", "u1", result("gpu-0", "4000Mi", "40", share=""))

    await driver.prepare("ns", "c", "u1")

    assert (
        env(paths, "u1")["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4000m" and env(paths, "u1")["CUDA_DEVICE_SM_LIMIT"] == "40"
    )


async def test_a_new_configuration_is_applied(root):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result("gpu-0", "15360Mi", "100", share=""))
    await driver.prepare("ns", "c", "u1")
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" in env(paths, "u1")
    params = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "isolation": "none"}
    config = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params}}]
    api.set("c", "u1", result("gpu-0", "15360Mi", "100", share=""), config=config)

    await driver.prepare("ns", "c", "u1")

    assert env(paths, "u1") == {"NVIDIA_VISIBLE_DEVICES": U0}


async def test_the_same_allocation_is_answered_from_the_checkpoint(root):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result())
    first = await driver.prepare("ns", "c", "u1")
    region = Path(paths.claim_dir("u1")) / "region.cache"
    region.write_text("in use")
    # what the allocation does not decide changes (reservedFor, device status): not a new allocation
    api.claims["c"]["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "p1"}]

    assert await driver.prepare("ns", "c", "u1") == first
    assert region.read_text() == "in use"


async def test_an_unreadable_claim_is_answered_from_the_checkpoint(root):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result())
    first = await driver.prepare("ns", "c", "u1")
    for answer in (KubeError("GET", "x", 500, "etcd"), TimeoutError()):
        api.fail = answer
        assert await driver.prepare("ns", "c", "u1") == first
    api.fail = None
    del api.claims["c"]  # deleted: the sweep's business, not prepare's
    assert await driver.prepare("ns", "c", "u1") == first
    api.set("c", "u-other", result("gpu-1"))  # re-created under the name: another claim
    assert await driver.prepare("ns", "c", "u1") == first
    assert env(paths, "u1")["NVIDIA_VISIBLE_DEVICES"] == U0


async def test_a_claim_no_longer_allocated_here_is_released_and_refused(root):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result())
    await driver.prepare("ns", "c", "u1")
    api.set("c", "u1", result(pool="node-b"))

    with pytest.raises(PrepareError, match="no device"):
        await driver.prepare("ns", "c", "u1")

    assert driver.checkpoint.get("u1") is None and not any(f.exists() for f in files(paths, "u1"))


async def test_an_entry_without_a_fingerprint_is_checked_on_its_devices(root):
    """An entry written before the fingerprint was recorded: the same devices and shareIDs are
    trusted (as before); another device or shareID is a new allocation."""
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result("gpu-0", "1000Mi", "10", "s1"))
    first = await driver.prepare("ns", "c", "u1")
    state = root / "state" / "checkpoint.json"
    doc = json.loads(state.read_text())
    [entry] = doc["claims"].values()
    assert "allocation" in entry
    del entry["allocation"]
    state.write_text(json.dumps(doc))
    driver, paths = make(root, api)  # the upgraded agent starts

    assert await driver.prepare("ns", "c", "u1") == first
    api.set("c", "u1", result("gpu-0", "1000Mi", "10", "s2"))
    [dev] = await driver.prepare("ns", "c", "u1")
    assert dev["share_id"] == "s2" and "allocation" in driver.checkpoint.get("u1")


# the sweep


async def test_the_sweep_releases_a_claim_deallocated_or_allocated_elsewhere(root):
    api = Api()
    driver, paths = make(root, api)
    for name, uid in (("here", "u-here"), ("gone", "u-gone"), ("moved", "u-moved")):
        api.set(name, uid, result())
        await driver.prepare("ns", name, uid)
    api.set("gone", "u-gone", allocated=False)
    api.set("moved", "u-moved", result(pool="node-b"))

    out = await sweep_once(driver, api)

    assert out.swept == {"u-gone": "deallocated", "u-moved": "deallocated"} and out.kept == ["u-here"]
    assert driver.checkpoint.uids() == ["u-here"]
    assert not any(f.exists() for uid in ("u-gone", "u-moved") for f in files(paths, uid))
    assert driver.metrics.registry.get_sample_value("hami_dra_swept_claims_total", {"reason": "deallocated"}) == 2


async def test_the_sweep_keeps_a_claim_prepared_again_while_it_read_it(root):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result(share=""))
    await driver.prepare("ns", "c", "u1")
    api.set("c", "u1", allocated=False)

    async def allocated_and_prepared_again():  # the same allocation: a hit, the entry unchanged
        api.set("c", "u1", result(share=""))
        await driver.prepare("ns", "c", "u1")

    api.during_read = allocated_and_prepared_again
    out = await sweep_once(driver, api)

    assert out.swept == {} and driver.checkpoint.uids() == ["u1"] and all(f.exists() for f in files(paths, "u1"))


# 2. files left by a prepare that died before its checkpoint entry


def leftovers(paths, uid):
    cdi, directory, record = files(paths, uid)
    cdi.parent.mkdir(parents=True, exist_ok=True)
    cdi.write_text("{}")
    directory.mkdir(parents=True)
    (directory / "region.cache").write_text("x")
    record.write_text("{}")
    return cdi, directory, record


async def test_unprepare_of_a_claim_without_an_entry_removes_its_files(root):
    api = Api()
    driver, paths = make(root, api)
    leftovers(paths, "u1")

    await driver.unprepare("ns", "c", "u1")

    assert not any(f.exists() for f in files(paths, "u1"))
    await driver.unprepare("ns", "c", "u1")  # idempotent


async def test_unprepare_without_an_entry_follows_no_link(root):
    api = Api()
    driver, paths = make(root, api)
    outside = root / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    _, directory, _ = leftovers(paths, "u1")
    (directory / "link").symlink_to(outside)  # the container writes the claim directory
    (directory / "filelink").symlink_to(outside / "keep")
    _, directory2, _ = leftovers(paths, "u2")
    shutil.rmtree(directory2)
    directory2.symlink_to(outside)

    await driver.unprepare("ns", "c", "u1")
    await driver.unprepare("ns", "c", "u2")

    assert (outside / "keep").read_text() == "keep"
    assert not any(os.path.lexists(f) for uid in ("u1", "u2") for f in files(paths, uid))


async def test_unprepare_of_a_uid_that_is_no_path_component_touches_nothing(root):
    api = Api()
    driver, paths = make(root, api)
    leftovers(paths, "u1")
    await driver.unprepare("ns", "c", "../claims/u1")
    await driver.unprepare("ns", "c", "")
    assert all(f.exists() for f in files(paths, "u1"))


# 3. an unprepare whose checkpoint write failed, then prepared again


async def test_a_hit_after_a_failed_unprepare_makes_the_claim_directory_and_record_again(root, monkeypatch):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result())
    first = await driver.prepare("ns", "c", "u1")
    record = json.loads(Path(paths.claim_record("u1")).read_text())

    def full(uid):
        raise CheckpointError("checkpoint: cannot write (No space left on device)")

    monkeypatch.setattr(driver.checkpoint, "remove", full)
    with pytest.raises(CheckpointError):
        await driver.unprepare("ns", "c", "u1")
    monkeypatch.undo()
    assert not Path(paths.claim_dir("u1")).exists()

    assert await driver.prepare("ns", "c", "u1") == first

    directory = Path(paths.claim_dir("u1"))
    assert directory.is_dir() and directory.stat().st_mode & 0o777 == 0o777
    assert json.loads(Path(paths.claim_record("u1")).read_text()) == record
    assert Path(paths.cdi_file("u1")).exists()
    # the grant file the CDI spec mounts read-only, made again from the spec's env
    spec = json.loads(Path(paths.cdi_file("u1")).read_text())
    (grant,) = [
        m for m in spec["devices"][0]["containerEdits"]["mounts"] if m["containerPath"].endswith("/hami-grant.env")
    ]
    assert grant["hostPath"] == str(directory / "hami-grant.env") and "ro" in grant["options"]
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    text = (directory / "hami-grant.env").read_text()
    assert f"CUDA_DEVICE_MEMORY_LIMIT_0={env['CUDA_DEVICE_MEMORY_LIMIT_0']}\n" in text


async def test_a_hit_for_a_claim_without_a_region_makes_no_directory(root):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result("gpu-0", "1000Mi", "0", adminAccess=True))
    await driver.prepare("ns", "c", "u1")
    assert not Path(paths.claim_dir("u1")).exists()
    await driver.prepare("ns", "c", "u1")
    assert not Path(paths.claim_dir("u1")).exists() and not Path(paths.claim_record("u1")).exists()


# 4. a UID twice in one request; the lock table


async def test_a_uid_twice_in_one_request_is_prepared_and_answered_once(root):
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result())
    service = DRAService(driver)
    ref = dra_pb.Claim(namespace="ns", name="c", uid="u1")

    out = await service.NodePrepareResources(dra_pb.NodePrepareResourcesRequest(claims=[ref, ref]), None)

    assert out.claims["u1"].error == "" and len(out.claims["u1"].devices) == 1
    assert driver.metrics.registry.get_sample_value("hami_dra_prepare_total", {"result": "ok"}) == 1
    out = await service.NodeUnprepareResources(dra_pb.NodeUnprepareResourcesRequest(claims=[ref, ref]), None)
    assert out.claims["u1"].error == "" and driver.checkpoint.uids() == []


async def test_the_lock_table_keeps_no_entry_for_a_claim_done_with(root):
    api = Api()
    driver, paths = make(root, api)
    with pytest.raises(PrepareError):
        await driver.prepare("ns", "missing", "u-missing")
    await driver.unprepare("ns", "c", "u-unknown")
    api.set("c", "u1", result())
    await driver.prepare("ns", "c", "u1")
    await driver.prepare("ns", "c", "u1")
    assert driver._locks == {}
    await driver.unprepare("ns", "c", "u1")
    assert driver._locks == {}


async def test_a_prepare_whose_checkpoint_write_failed_is_not_answered_from_memory(root, monkeypatch):
    """The entry was kept in memory after the file write failed, while the prepare's error path
    removed the files: a retry answered success from memory, and a restart forgot the claim.
    Found by an adversarial review."""
    import hami.draplugin.checkpoint as ck

    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result())

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "write_atomic", full)
    with pytest.raises(CheckpointError):
        await driver.prepare("ns", "c", "u1")
    assert driver.checkpoint.get("u1") is None and not Path(paths.cdi_file("u1")).exists()
    monkeypatch.undo()
    await driver.prepare("ns", "c", "u1")
    assert Checkpoint(driver.checkpoint.path).get("u1") is not None  # on disk, not only in memory
    assert Path(paths.cdi_file("u1")).exists()


def test_a_removal_whose_checkpoint_write_failed_keeps_the_entry(tmp_path, monkeypatch):
    import hami.draplugin.checkpoint as ck

    c = Checkpoint(tmp_path / "c.json")
    entry = {"devices": [], "cdi_file": "/x", "cdi_spec": {}}
    c.put("u1", entry)
    monkeypatch.setattr(ck, "write_atomic", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "full")))
    with pytest.raises(CheckpointError):
        c.remove("u1")
    with pytest.raises(CheckpointError):
        c.put("u1", dict(entry, cdi_file="/y"))
    assert c.get("u1") == entry


async def test_a_hit_never_reads_or_follows_what_the_claims_containers_put_at_the_grants_name(root):
    """Found by review (1 Dec): a prepare the kubelet repeats read the grant file first to compare
    it, through whatever the claim's containers (which write the directory) had put at its name:
    a FIFO blocked the agent, a link was followed as root. Then it was written again, replacing
    it; but a rename over the grant unmounts it in the running containers (review, 1 Dec), so a
    FIFO or a link there now fails the prepare (never opened for reading, never followed)."""
    api = Api()
    driver, paths = make(root, api)
    api.set("c", "u1", result())
    await driver.prepare("ns", "c", "u1")
    grant = Path(paths.claim_dir("u1"), "hami-grant.env")
    grant.unlink()
    os.mkfifo(grant)  # opened for reading, this blocks until a writer comes
    with pytest.raises(PrepareError):
        await driver.prepare("ns", "c", "u1")
    outside = Path(root, "host-file")
    outside.write_text("the host's\n")
    grant.unlink()
    grant.symlink_to(outside)
    with pytest.raises(PrepareError):
        await driver.prepare("ns", "c", "u1")
    assert outside.read_text() == "the host's\n" and grant.is_symlink()
