"""The DRA agent keeps the GPUs it marked unhealthy across its restarts (``<state dir>/health.json``):
a restarted agent publishes them tainted from its first publish, a restored mark clears by the
run-time rule only (``--health-recovery`` counted from the mark), a reboot resets them, and a
damaged or unknown record costs the marks, never the start nor the prepared claims."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import tempfile

from aiohttp import web
from aiohttp.test_utils import TestServer

from hami.dra.model import SliceSettings
from hami.draplugin.checkpoint import Checkpoint, HealthRecord
from hami.draplugin.health import HealthBook
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings

BOOT = "0b5e8a2c-1d2f-4a6b-9c3d-5e7f8a9b0c1d"
OTHER_BOOT = "7d1c3b5a-2e4f-4a6b-8c9d-0e1f2a3b4c5d"


class Clocks:
    """A monotonic clock (restarting at 0 in each process, as after a restart) and a wall clock."""

    def __init__(self, wall: float) -> None:
        self.mono, self.wall = 0.0, wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def _book(record: HealthRecord, clocks: Clocks, recovery: float = 0.0, probe=lambda uuid: True) -> HealthBook:
    """A started agent's book: what the record holds restored, every change saved."""
    book = HealthBook(recovery, probe, clock=lambda: clocks.mono, wall=lambda: clocks.wall)
    book.restore(*record.load(BOOT))
    book.saved = lambda marks, notes: record.save(BOOT, marks, notes)
    return book


def test_a_mark_and_a_note_outlive_a_restart(tmp_path):
    record, clocks = HealthRecord(tmp_path / "health.json"), Clocks(1_700_000_000.0)
    first = _book(record, clocks)
    first.mark(["GPU-1"])
    first.note("GPU-0", 31)
    clocks.mono = 0.0  # the agent restarts: a new process, a new monotonic origin
    clocks.wall += 600
    again = _book(record, clocks)
    assert again.unhealthy() == {"GPU-1"}
    assert again.notes() == {"GPU-0": 31}
    doc = json.loads((tmp_path / "health.json").read_text())
    assert doc["version"] == 1 and doc["boot"] == BOOT and set(doc["unhealthy"]) == {"GPU-1"}


def test_a_restored_mark_clears_by_the_run_time_rule_counted_from_the_mark(tmp_path):
    record, clocks = HealthRecord(tmp_path / "health.json"), Clocks(1_700_000_000.0)
    _book(record, clocks, recovery=600).mark(["GPU-1"])
    clocks.mono, clocks.wall = 5.0, clocks.wall + 400  # restarted 400 s after the mark
    probed = []
    again = _book(record, clocks, recovery=600, probe=lambda uuid: probed.append(uuid) or True)
    assert again.recover() == [] and again.unhealthy() == {"GPU-1"}
    assert again.due() == 200.0  # not a fresh 600 s: the wait counts from the mark
    clocks.advance(200)
    assert again.recover() == ["GPU-1"] and probed == ["GPU-1"]
    clocks.mono, clocks.wall = 0.0, clocks.wall + 1
    assert _book(record, clocks, recovery=600).unhealthy() == frozenset()  # the clearing was recorded too


def test_without_recovery_a_restored_mark_stays(tmp_path):
    record, clocks = HealthRecord(tmp_path / "health.json"), Clocks(1_700_000_000.0)
    _book(record, clocks).mark(["GPU-1"])
    clocks.mono, clocks.wall = 0.0, clocks.wall + 86_400
    again = _book(record, clocks)
    assert again.recover() == [] and again.unhealthy() == {"GPU-1"}


def test_a_record_made_before_a_reboot_is_not_restored(tmp_path):
    record = HealthRecord(tmp_path / "health.json")
    record.save(OTHER_BOOT, {"GPU-1": 1_700_000_000.0}, {})
    assert record.load(BOOT) == ({}, {})
    assert record.load(OTHER_BOOT) == ({"GPU-1": 1_700_000_000.0}, {})
    assert record.load("") == ({"GPU-1": 1_700_000_000.0}, {})  # no boot id read: no reboot seen


def test_a_damaged_or_unknown_record_is_no_marks_logged_and_replaced(tmp_path, caplog):
    path = tmp_path / "health.json"
    for content in (
        b"\xff",
        b"{not json",
        b"[]",
        json.dumps({"version": 2, "unhealthy": {}}).encode(),
        json.dumps({"version": 1, "unhealthy": {"GPU-1": "yesterday"}, "notes": {}}).encode(),
        json.dumps({"version": 1, "unhealthy": [], "notes": {}}).encode(),
        json.dumps({"version": 1, "unhealthy": {}, "notes": {"GPU-0": {"xid": 31}}}).encode(),
    ):
        path.write_bytes(content)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert HealthRecord(path).load(BOOT) == ({}, {}), content
        assert any(str(path) in r.getMessage() for r in caplog.records), content
    clocks = Clocks(1_700_000_000.0)
    _book(HealthRecord(path), clocks).mark(["GPU-1"])
    assert HealthRecord(path).load(BOOT)[0] == {"GPU-1": 1_700_000_000.0}


def test_a_record_that_cannot_be_written_keeps_the_mark_in_memory(tmp_path, caplog):
    (tmp_path / "state").write_text("a file where the directory should be")
    clocks = Clocks(1_700_000_000.0)
    book = _book(HealthRecord(tmp_path / "state" / "health.json"), clocks)
    with caplog.at_level(logging.ERROR):
        book.mark(["GPU-1"])
    assert book.unhealthy() == {"GPU-1"}
    assert any("GPU health not recorded" in r.getMessage() for r in caplog.records)


async def test_a_restarted_agent_publishes_the_gpu_it_marked_tainted_and_keeps_its_claims(tmp_path, monkeypatch):
    from hami.draplugin.command import _serve

    monkeypatch.setenv("DP_DISABLE_HEALTHCHECKS", "all")  # no NVML watcher in a unit test
    monkeypatch.setattr("hami.draplugin.plugin.read_boot_id", lambda *a: BOOT)
    state = tmp_path / "state"
    # what the previous run left: GPU-1 marked, one claim prepared
    HealthRecord(state / "health.json").save(BOOT, {"GPU-1": 1_700_000_000.0}, {})
    claim = {"devices": [{"poolName": "n1"}], "cdi_file": str(tmp_path / "cdi.json"), "cdi_spec": {}}
    Checkpoint(state / "checkpoint.json").put("uid-1", claim)

    applied: list[dict] = []

    async def handler(request: web.Request) -> web.Response:
        if request.method == "GET" and request.path == "/api/v1/nodes/n1":
            return web.json_response({"metadata": {"name": "n1", "uid": "node-uid"}})
        if request.method == "PATCH" and "/resourceslices/" in request.path:
            body = await request.json()
            applied.append(body)
            os.kill(os.getpid(), signal.SIGTERM)  # seen the first publish: the agent may stop
            return web.json_response(body)
        return web.json_response({"kind": "Status", "message": "not found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    # (a short path: a unix socket's name has at most 107 characters)
    kubelet = tempfile.mkdtemp(prefix="hk")
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
            state_dir=str(state),
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
        gpus = [PhysicalGPU(i, f"GPU-{i}", "Tesla T4", 15360, f"0000:{i + 1:02x}:00.0", 0) for i in range(2)]
        try:
            await asyncio.wait_for(_serve(args, NodeSettings(), gpus, SliceSettings(split_count=4)), 120)
        finally:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            shutil.rmtree(kubelet, ignore_errors=True)
    first = applied[0]["spec"]["devices"]
    taints = {d["name"]: [t["key"] for t in d.get("taints") or ()] for d in first}
    assert taints == {"gpu-0": [], "gpu-1": ["gpu.hami.io/unhealthy"]}
    assert Checkpoint(state / "checkpoint.json").uids() == ["uid-1"]
