"""The DRA agent, found by review, 1 Dec: a dynamic MIG instance NVML refuses to destroy at
unprepare (kept, retried, never handed to the claim's next allocation), the ResourceSlice's owner
following a Node made again, and a cluster that drops device taints never storing an unhealthy GPU
untainted at the agent's start. Real Driver, MigManager (over the fake NVML MIG model of
test_dra_mig), sweep, publisher and ``_serve`` against an aiohttp API server."""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pynvml
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hami.dra.model import SliceSettings, slice_name
from hami.draplugin.checkpoint import HealthRecord
from hami.draplugin.prepare import PrepareError
from hami.draplugin.publisher import publish_slice
from hami.draplugin.sweep import sweep_once
from hami.kube.client import KubeError
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings

from .test_dra_mig import A100, FakeMig, Node, allocated, env_of

BOOT = "0b5e8a2c-1d2f-4a6b-9c3d-5e7f8a9b0c1d"


class BusyMig(FakeMig):
    """The fake A100, where NVML refuses to destroy the GPU instances in ``busy`` (a process
    still runs on them: ``NVML_ERROR_IN_USE``)."""

    def __init__(self) -> None:
        super().__init__()
        self.busy: set[int] = set()

    def destroy(self, uuid, gi):
        if gi in self.busy:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
        super().destroy(uuid, gi)


def visible(root: Path, uid: str) -> str:
    [line] = [e for e in env_of(root, uid) if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    return line.split("=", 1)[1]


# ------------------------------------------------------------------ 1: MIG instance kept at unprepare


def test_an_unprepare_whose_mig_instance_is_busy_fails_keeps_the_claim_and_succeeds_when_retried(tmp_path):
    """Found by review, 1 Dec: NVML refused to destroy the claim's instance (IN_USE), the manager
    kept it, and the unprepare still answered success and dropped the claim's record: nothing tried
    again. Now the unprepare fails naming the instance, the record stays, the retry destroys it."""
    nvml = BusyMig()
    node = Node(tmp_path, nvml, {"c-u1": allocated("u1", "gpu-0-1g-5gb-0")})
    driver = node.driver()
    driver.recover_mig()
    asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    [gi] = list(nvml.live)
    nvml.busy.add(gi)
    with pytest.raises(
        PrepareError, match=rf"claim ns/c-u1 \(u1\): .*cannot destroy GPU instance {gi} \(1g.5gb at 0\)"
    ):
        asyncio.run(driver.unprepare("ns", "c-u1", "u1"))
    assert driver.checkpoint.get("u1") is not None and list(nvml.live) == [gi]
    nvml.busy.clear()  # the process ended: the kubelet's retry finishes the unprepare
    asyncio.run(driver.unprepare("ns", "c-u1", "u1"))
    assert nvml.live == {} and driver.checkpoint.get("u1") is None
    assert driver.mig is not None and driver.mig.entries == {}


def test_a_claim_allocated_again_elsewhere_never_gets_its_old_mig_instance(tmp_path):
    """Found by review, 1 Dec (the reviewer's scenario): claim u1's 1g.5gb at 0 (MIG-0001) outlived
    its record (here: the answer never recorded), u1 was allocated again as 3g.20gb at 4, and the
    manager reused its entry u1/0/0 without comparing GPU, profile and placement: the container got
    the old 1g instance, and u2, allocated the 1g slice the scheduler thought free, was refused."""
    nvml = FakeMig()
    claims = {"c-u1": allocated("u1", "gpu-0-1g-5gb-0"), "c-u2": allocated("u2", "gpu-0-1g-5gb-0")}
    node = Node(tmp_path, nvml, claims)
    driver = node.driver()
    asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    assert visible(tmp_path, "u1") == "MIG-0001"
    driver.checkpoint.remove("u1")  # made, not recorded (an unprepare that dropped the record)
    claims["c-u1"] = allocated("u1", "gpu-0-3g-20gb-4")
    asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    [three] = [i for i in nvml.instances(A100) if i.profile == "3g.20gb"]
    assert visible(tmp_path, "u1") == three.mig_uuid
    assert [(i.profile, i.start) for i in nvml.instances(A100)] == [("3g.20gb", 4)]  # the old one destroyed
    asyncio.run(driver.prepare("ns", "c-u2", "u2"))  # the 1g slice is free, as the scheduler thinks
    assert sorted((i.profile, i.start) for i in nvml.instances(A100)) == [("1g.5gb", 0), ("3g.20gb", 4)]


def test_a_claim_allocated_again_is_refused_while_its_old_instance_cannot_be_destroyed(tmp_path):
    """Found by review, 1 Dec: the old instance is busy, so it can be neither destroyed nor handed
    out as the new allocation: the prepare fails naming it, and nothing new is made."""
    nvml = BusyMig()
    claims = {"c-u1": allocated("u1", "gpu-0-1g-5gb-0")}
    node = Node(tmp_path, nvml, claims)
    driver = node.driver()
    asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    [gi] = list(nvml.live)
    nvml.busy.add(gi)
    driver.checkpoint.remove("u1")
    claims["c-u1"] = allocated("u1", "gpu-0-3g-20gb-4")
    with pytest.raises(PrepareError, match=rf"claim ns/c-u1: .*3g.20gb at 4.*cannot destroy GPU instance {gi}"):
        asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    assert [(i.profile, i.start) for i in nvml.instances(A100)] == [("1g.5gb", 0)]
    assert driver.checkpoint.get("u1") is None


class GoneClaims:
    """KubeClient's ``get`` for the sweep: every claim is gone (404)."""

    async def get(self, path, **query):
        raise KubeError("GET", path, 404, '{"kind":"Status","reason":"NotFound"}')


def test_the_sweep_keeps_a_claim_whose_mig_instance_is_busy_and_sweeps_the_others(tmp_path):
    """Found by review, 1 Dec: a swept claim's busy instance was dropped with its record as the
    unprepare's was; now that claim is kept (an error of this sweep), the others are swept, and
    the next sweep finishes it without a second grace period."""
    nvml = BusyMig()
    claims = {"c-u1": allocated("u1", "gpu-0-1g-5gb-0"), "c-u2": allocated("u2", "gpu-0-3g-20gb-4")}
    driver = Node(tmp_path, nvml, claims).driver()
    asyncio.run(driver.prepare("ns", "c-u1", "u1"))
    asyncio.run(driver.prepare("ns", "c-u2", "u2"))
    [busy] = [i.gi for i in nvml.instances(A100) if i.profile == "1g.5gb"]
    nvml.busy.add(busy)
    gone: dict[str, float] = {}
    clock = iter([0.0, 100.0, 100.5]).__next__
    first = asyncio.run(sweep_once(driver, GoneClaims(), 60, gone, clock))
    assert first.waiting == {"u1": "deleted", "u2": "deleted"}
    second = asyncio.run(sweep_once(driver, GoneClaims(), 60, gone, clock))
    assert second.swept == {"u2": "deleted"} and list(second.errors) == ["u1"]
    assert f"cannot destroy GPU instance {busy}" in second.errors["u1"]
    assert driver.checkpoint.uids() == ["u1"] and list(nvml.live) == [busy]
    nvml.busy.clear()
    third = asyncio.run(sweep_once(driver, GoneClaims(), 60, gone, clock))  # 0.5 s later: no new grace
    assert third.swept == {"u1": "deleted"} and nvml.live == {} and driver.checkpoint.uids() == []


# ------------------------------------------------------------------ 2 and 3: the agent against an API server


class Cluster:
    """An API server for ``_serve``: node ``n1`` (GET answers ``node_uid``; its list answers
    ``listed``), the node's ResourceSlices stored on apply (``dryRun=All`` answered, not stored;
    taints dropped when ``keep_taints`` is False), watches that stay quiet. ``stop_when(real)``
    decides, after each stored apply, whether to SIGTERM the agent."""

    def __init__(self, node_uid: str, listed: dict, keep_taints: bool = True, stop_when=lambda real: True) -> None:
        self.node_uid, self.listed, self.keep_taints, self.stop_when = node_uid, listed, keep_taints, stop_when
        self.slices: dict[str, dict] = {}
        self.real: list[dict] = []  # what each stored apply stored
        self.dry: list[dict] = []  # what each dry run answered

    async def handle(self, request: web.Request) -> web.Response:
        path, query = request.path, request.query
        if query.get("watch") == "true":
            await asyncio.sleep(3600)  # a watch that stays quiet
        if request.method == "GET" and path == "/api/v1/nodes/n1":
            return web.json_response({"kind": "Node", "metadata": {"name": "n1", "uid": self.node_uid}})
        if request.method == "GET" and path == "/api/v1/nodes":
            return web.json_response({"kind": "NodeList", "metadata": {"resourceVersion": "5"}, "items": [self.listed]})
        if request.method == "GET" and path == "/apis/resource.k8s.io/v1/resourceslices":
            items = list(self.slices.values())
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": items})
        name = path.rsplit("/", 1)[-1]
        if request.method == "GET" and name in self.slices:
            return web.json_response(self.slices[name])
        if request.method == "PATCH" and "/resourceslices/" in path:
            obj = copy.deepcopy(await request.json())
            if not self.keep_taints:
                for d in obj["spec"].get("devices") or ():
                    d.pop("taints", None)
            if query.get("dryRun") == "All":
                self.dry.append(obj)
                return web.json_response(obj)
            self.slices[name] = obj
            self.real.append(obj)
            if self.stop_when(self.real):
                os.kill(os.getpid(), signal.SIGTERM)
            return web.json_response(obj)
        return web.json_response({"kind": "Status", "code": 404}, status=404)


async def serve(tmp_path: Path, cluster: Cluster, gpus: list) -> None:
    from hami.draplugin.command import _serve

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", cluster.handle)
    kubelet = tempfile.mkdtemp(prefix="hk")  # short: a unix socket's path is at most 107 characters
    async with TestServer(app) as server:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{str(server.make_url("")).rstrip("/")}"}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
users: [{{name: u, user: {{token: t}}}}]
"""
        )
        args = argparse.Namespace(
            state_dir=str(tmp_path / "state"),
            kubeconfig=str(kubeconfig),
            node_name="n1",
            health_recovery_seconds=0.0,
            unhealthy_taint="NoSchedule",
            apply_classes=False,
            extended_resource_name="",
            hook_path=str(tmp_path / "hook"),
            lock_dir=str(tmp_path / "lock"),
            driver_mount=[],
            cdi_dir=str(tmp_path / "cdi"),
            kubelet_dir=kubelet,
            bind=None,
            sweep_seconds=0.0,
            sweep_grace_seconds=0.0,
        )
        try:
            await _serve(args, NodeSettings(), gpus, SliceSettings(split_count=4))
        finally:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            shutil.rmtree(kubelet, ignore_errors=True)


GPUS = [PhysicalGPU(i, f"GPU-{i}", "Tesla T4", 15360, f"0000:{i + 1:02x}:00.0", 0) for i in range(2)]


def owner(obj: dict) -> str:
    return obj["metadata"]["ownerReferences"][0]["uid"]


async def test_the_slice_follows_a_node_made_again_under_a_running_agent(tmp_path, monkeypatch):
    """Found by review, 1 Dec: the slice's owner was the Node UID read once at the start. The Node
    was deleted and made again (new UID) while the agent ran: the garbage collector deleted the
    slice owned by the gone Node, the agent published it again with the same owner, and so on.
    Now the UID of the Node the agent watches is followed (the list after the start shows the new
    Node; it also cordons a GPU of another node, which had the old agent publish again too)."""
    monkeypatch.setenv("DP_DISABLE_HEALTHCHECKS", "all")  # no NVML watcher in a unit test
    listed = {"metadata": {"name": "n1", "uid": "uid-new", "annotations": {"hami.io/device-cordon": "GPU-elsewhere"}}}
    cluster = Cluster("uid-old", listed, stop_when=lambda real: len(real) == 2)
    await asyncio.wait_for(serve(tmp_path, cluster, GPUS), 120)
    assert [owner(s) for s in cluster.real] == ["uid-old", "uid-new"]


async def test_a_cluster_that_drops_device_taints_never_stores_the_unhealthy_gpu_at_a_start(tmp_path, monkeypatch):
    """Found by review, 1 Dec: every start took the cluster to keep device taints, so its first
    publish stored GPU-1 (marked unhealthy before the restart) with the taint the API server
    dropped: allocatable, until the fallback publish right after. Now a dry run shows the taint
    dropped first, and only the slice without GPU-1 is ever stored."""
    monkeypatch.setenv("DP_DISABLE_HEALTHCHECKS", "all")
    monkeypatch.setattr("hami.draplugin.plugin.read_boot_id", lambda *a: BOOT)
    HealthRecord(tmp_path / "state" / "health.json").save(BOOT, {"GPU-1": 1_700_000_000.0}, {})
    listed = {"metadata": {"name": "n1", "uid": "uid-1"}}
    cluster = Cluster("uid-1", listed, keep_taints=False)
    await asyncio.wait_for(serve(tmp_path, cluster, GPUS), 120)
    assert cluster.real and all([d["name"] for d in s["spec"]["devices"]] == ["gpu-0"] for s in cluster.real)
    assert [[d["name"] for d in s["spec"]["devices"]] for s in cluster.dry] == [["gpu-0", "gpu-1"]]


class Api:
    """KubeClient's get/request over the stored slices (``dryRun=All`` answered, not stored)."""

    def __init__(self, keep_taints: bool = True) -> None:
        self.keep_taints = keep_taints
        self.slices: dict[str, dict] = {}
        self.writes: list[tuple[bool, list[str]]] = []  # (dry run, the devices with a taint)

    async def get(self, path, **query):
        if path.rsplit("/", 1)[-1] not in self.slices:
            raise KubeError("GET", path, 404, "not found")
        return self.slices[path.rsplit("/", 1)[-1]]

    async def request(self, method, path, query=None, body=None, content_type=None):
        assert method == "PATCH"
        obj = copy.deepcopy(body)
        if not self.keep_taints:
            for d in obj["spec"]["devices"]:
                d.pop("taints", None)
        dry = ("dryRun", "All") in (query or ())
        self.writes.append((dry, [d["name"] for d in obj["spec"]["devices"] if d.get("taints")]))
        if not dry:
            self.slices[path.rsplit("/", 1)[-1]] = obj
        return obj


def test_taints_not_known_yet_are_tried_as_a_dry_run_once_and_then_kept():
    """Found by review, 1 Dec: where the cluster keeps taints the dry run shows it, the slice is
    stored tainted, and the caller is told, so that its next publishes skip the dry run."""
    api, told, kept = Api(), [], []
    s = SliceSettings(split_count=4)
    got = asyncio.run(
        publish_slice(
            api,
            "n1",
            GPUS,
            s,
            frozenset({"GPU-1"}),
            "",
            "NoSchedule",
            None,
            None,
            told.append,
            frozenset(),
            None,
            lambda: kept.append(True),
        )
    )
    assert api.writes == [(True, ["gpu-1"]), (False, ["gpu-1"])] and kept == [True] and told == []
    assert [d["name"] for d in got["spec"]["devices"] if d.get("taints")] == ["gpu-1"]
    assert got["metadata"]["name"] == slice_name("n1")
