"""The kubelet plugin over its unix sockets, called as the kubelet calls it: registration
GetInfo/NotifyRegistrationStatus, NodePrepareResources / NodeUnprepareResources, idempotency across
a plugin restart, per-claim errors, socket permissions."""

import json
import shutil
import stat
import tempfile
from pathlib import Path

import grpc
import pytest

from hami.node.nvml import PhysicalGPU
from hami.draplugin.api import load
from hami.draplugin.checkpoint import Checkpoint
from hami.dra.model import DRIVER, SliceSettings
from hami.draplugin.plugin import Driver, PluginServer, socket_paths
from hami.draplugin.prepare import Paths

dra_pb, dra_grpc = load("dra")
reg_pb, reg_grpc = load("registration")
U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPUS = [PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 0)]


@pytest.fixture
def root():
    d = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))  # short: unix socket paths are limited
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Claims:
    """What the API server would answer for each claim; counts the reads."""

    def __init__(self):
        self.objects = {}
        self.reads = 0

    def add(self, name, uid, memory="3000Mi", cores="30"):
        self.objects[name] = {
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": DRIVER,
                                "pool": "node-a",
                                "device": "gpu-0",
                                "shareID": f"share-{uid}",
                                "consumedCapacity": {"memory": memory, "cores": cores, "shares": "1"},
                            }
                        ]
                    }
                }
            },
        }

    async def read(self, namespace, name):
        self.reads += 1
        if name not in self.objects:
            raise LookupError(f"resourceclaims {namespace}/{name} not found")
        return self.objects[name]


async def start(root, claims):
    paths = Paths(hook_path=str(root / "usr"), lock_dir=str(root / "lock"), cdi_dir=str(root / "cdi"))
    driver = Driver("node-a", GPUS, SliceSettings(), Checkpoint(root / "state" / "checkpoint.json"), claims.read, paths)
    reg, dra = socket_paths(root / "kubelet")
    server = PluginServer(driver, reg, dra)
    await server.start()
    return server, paths


def claim_ref(name, uid):
    return dra_pb.Claim(namespace="ns", name=name, uid=uid)


async def test_registration_answers_the_kubelet_and_sockets_are_root_only(root):
    server, _ = await start(root, Claims())
    try:
        reg_sock, dra_sock = socket_paths(root / "kubelet")
        assert reg_sock == root / "kubelet/plugins_registry/gpu.hami.io-reg.sock"
        for sock in (reg_sock, dra_sock):
            assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        async with grpc.aio.insecure_channel(f"unix://{reg_sock}") as ch:
            stub = reg_grpc.RegistrationStub(ch)
            info = await stub.GetInfo(reg_pb.InfoRequest())
            assert (info.type, info.name, info.endpoint) == ("DRAPlugin", "gpu.hami.io", str(dra_sock))
            assert list(info.supported_versions) == ["v1.DRAPlugin"]
            await stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=False, error="nope"))
            assert server.registration.status == (False, "nope") and not server.registration.registered.is_set()
            await stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True))
            assert server.registration.registered.is_set()
    finally:
        await server.stop()
    assert not reg_sock.exists() and not dra_sock.exists()


async def test_prepare_writes_cdi_and_unprepare_removes_it_idempotently_across_restart(root):
    claims = Claims()
    claims.add("c1", "uid-1")
    server, paths = await start(root, claims)
    _, dra_sock = socket_paths(root / "kubelet")
    cdi = root / "cdi" / "gpu.hami.io-uid-1.json"
    try:
        async with grpc.aio.insecure_channel(f"unix://{dra_sock}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            resp = await stub.NodePrepareResources(
                dra_pb.NodePrepareResourcesRequest(claims=[claim_ref("c1", "uid-1")])
            )
            got = resp.claims["uid-1"]
            assert got.error == ""
            [dev] = got.devices
            assert (list(dev.request_names), dev.pool_name, dev.device_name) == (["gpu"], "node-a", "gpu-0")
            assert list(dev.cdi_device_ids) == ["gpu.hami.io/claim=uid-1"] and dev.share_id == "share-uid-1"
            spec = json.loads(cdi.read_text())
            env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
            assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and env["NVIDIA_VISIBLE_DEVICES"] == U0
            assert Path(paths.claim_dir("uid-1")).is_dir()
            assert Path(paths.claim_dir("uid-1")).stat().st_mode & 0o777 == 0o777  # regions made by any UID
            # the record naming the claim for `hami monitor` is beside the directory the container mounts
            record = Path(paths.claim_record("uid-1"))
            assert record.parent == Path(paths.claim_dir("uid-1")).parent
            assert json.loads(record.read_text()) == {"namespace": "ns", "name": "c1", "uid": "uid-1", "devices": [U0]}
            assert claims.reads == 1
    finally:
        await server.stop()

    # the plugin restarts; the kubelet prepares again (e.g. after its own restart) and /var/run was wiped
    cdi.unlink()
    claims.objects.clear()  # the answer must come from the checkpoint, not the API server
    server, paths = await start(root, claims)
    try:
        async with grpc.aio.insecure_channel(f"unix://{dra_sock}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            resp = await stub.NodePrepareResources(
                dra_pb.NodePrepareResourcesRequest(claims=[claim_ref("c1", "uid-1")])
            )
            assert resp.claims["uid-1"].error == "" and resp.claims["uid-1"].devices[0].device_name == "gpu-0"
            # read again to check the allocation is still the one prepared; gone, the recorded answer
            assert json.loads(cdi.read_text()) == spec and claims.reads == 2
            for _ in range(2):  # unprepare twice: the second is a no-op that succeeds
                resp = await stub.NodeUnprepareResources(
                    dra_pb.NodeUnprepareResourcesRequest(claims=[claim_ref("c1", "uid-1")])
                )
                assert resp.claims["uid-1"].error == ""
            assert not cdi.exists() and not Path(paths.claim_dir("uid-1")).exists()
            assert not Path(paths.claim_record("uid-1")).exists()
    finally:
        await server.stop()
    assert Checkpoint(root / "state" / "checkpoint.json").uids() == []


async def test_each_claim_fails_alone_with_a_message(root):
    claims = Claims()
    claims.add("good", "uid-g")
    claims.add("recreated", "uid-new")
    claims.add("bad", "uid-b", memory="lots")
    server, _ = await start(root, claims)
    _, dra_sock = socket_paths(root / "kubelet")
    try:
        async with grpc.aio.insecure_channel(f"unix://{dra_sock}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            resp = await stub.NodePrepareResources(
                dra_pb.NodePrepareResourcesRequest(
                    claims=[
                        claim_ref("good", "uid-g"),
                        claim_ref("recreated", "uid-old"),
                        claim_ref("bad", "uid-b"),
                        claim_ref("missing", "uid-m"),
                        claim_ref("nouid", ""),
                    ]
                )
            )
            assert resp.claims["uid-g"].error == "" and len(resp.claims["uid-g"].devices) == 1
            assert "deleted and re-created" in resp.claims["uid-old"].error
            assert "consumedCapacity.memory" in resp.claims["uid-b"].error
            assert "not found" in resp.claims["uid-m"].error
            assert "uid is empty" in resp.claims[""].error
    finally:
        await server.stop()
    assert sorted(p.name for p in (root / "cdi").iterdir()) == ["gpu.hami.io-uid-g.json"]
    assert Checkpoint(root / "state" / "checkpoint.json").uids() == ["uid-g"]


async def test_a_uid_that_is_not_one_path_component_is_refused_and_nothing_is_written(root):
    """Found by make fuzz (DRA gRPC prepare): uid ".." (the API server agreeing) was prepared: its claim
    directory was <hook>/vgpu/claims/.., the vgpu directory itself, made mode 0777 and removed by
    unprepare; "a/b" wrote outside the CDI directory."""
    claims = Claims()
    for uid in ("..", "a/b", ".hidden"):
        claims.add(f"c{len(claims.objects)}", uid)
    server, paths = await start(root, claims)
    _, dra_sock = socket_paths(root / "kubelet")
    try:
        async with grpc.aio.insecure_channel(f"unix://{dra_sock}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            refs = [claim_ref(name, c["metadata"]["uid"]) for name, c in claims.objects.items()]
            resp = await stub.NodePrepareResources(dra_pb.NodePrepareResourcesRequest(claims=refs))
            for ref in refs:
                assert f"uid {ref.uid!r} is not a Kubernetes UID" in resp.claims[ref.uid].error
    finally:
        await server.stop()
    assert claims.reads == 0 and not (root / "cdi").exists() and not (root / "usr").exists()


@pytest.mark.parametrize("damage", ["truncated", "empty", "foreign"])
async def test_a_damaged_cdi_file_of_a_prepared_claim_is_written_again(root, damage):
    """Found by make fuzz (CDI directory): only a missing file was written again; a truncated one
    stayed, and every container of the claim failed to start on it."""
    claims = Claims()
    claims.add("c1", "uid-1")
    server, _ = await start(root, claims)
    _, dra_sock = socket_paths(root / "kubelet")
    cdi = root / "cdi" / "gpu.hami.io-uid-1.json"
    try:
        async with grpc.aio.insecure_channel(f"unix://{dra_sock}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            req = dra_pb.NodePrepareResourcesRequest(claims=[claim_ref("c1", "uid-1")])
            assert (await stub.NodePrepareResources(req)).claims["uid-1"].error == ""
            good = cdi.read_bytes()
            cdi.write_bytes({"truncated": good[: len(good) // 2], "empty": b"", "foreign": b'{"kind": "x"}'}[damage])
            assert (await stub.NodePrepareResources(req)).claims["uid-1"].error == ""
            assert cdi.read_bytes() == good and claims.reads == 2  # the same allocation: as recorded
    finally:
        await server.stop()
