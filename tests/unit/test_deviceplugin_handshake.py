"""The device plugin's answer to the legacy handshake (hami.deviceplugin.register).

HAMi's schedulers before v2.8 (util.CheckHealth / device.CheckHealth, 2024-2025) write
``hami.io/node-handshake: Requesting_<time>`` on a node whose handshake says anything else, and
when that value is still there 60 s later they write ``Deleted_<time>`` and drop the node's
devices until the handshake changes again. HAMi's own plugin of that time rewrote
``Reported <time>`` every 30 s. Our scheduler (and HAMi's since v2.8) writes ``Requesting_`` once
and never expires it. The simulations below run a scheduler pass every 15 s and after every node
write, as RegisterFromNodeAnnotations does, and the plugin's check every 30 s.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta

import pytest

from hami.deviceplugin import command as dp_command
from hami.deviceplugin.devices import DeviceState
from hami.deviceplugin.register import (
    ANSWER_WITHIN_S,
    HANDSHAKE,
    REGISTER,
    Registrar,
    expiring_scheduler,
    registration_patch,
)
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings

GPUS = [PhysicalGPU(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA A100", 40960, "0000:3b:00.0", 0)]
T0 = datetime(2026, 3, 1, 12, 0, 0)
DASH = "%Y-%m-%d %H:%M:%S"  # Go time.DateTime: HAMi since 2025, and ours
DOT = "%Y.%m.%d %H:%M:%S"  # HAMi before 2025


class Node:
    """One Node's annotations, the writes made to them, and a simulated clock."""

    def __init__(self) -> None:
        self.ann: dict[str, str] = {}
        self.writes: list[tuple[int, str, dict]] = []
        self.t = 0
        self.on_write = lambda: None

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.t)

    def write(self, who: str, values: dict) -> None:
        for k, v in values.items():
            if v is None:
                self.ann.pop(k, None)
            else:
                self.ann[k] = v
        self.writes.append((self.t, who, dict(values)))


class FakeKube:
    node_name = "gpu-1"

    def __init__(self, node: Node) -> None:
        self.node = node

    async def node_annotations(self):
        return dict(self.node.ann), "1"

    async def patch_node_annotations(self, values, resource_version=None):
        self.node.write("plugin", values)
        self.node.on_write()  # the scheduler's node informer fires at once


class OldHamiScheduler:
    """HAMi < v2.8 for NVIDIA: CheckHealth on the handshake alone, NodeCleanUp = ``Deleted_``."""

    def __init__(self, node: Node, fmt: str = DASH) -> None:
        self.node, self.fmt = node, fmt
        self.devices = False  # the node's GPUs are in the scheduler's cache

    def register_pass(self) -> None:
        now = self.node.now()
        shake = self.node.ann.get(HANDSHAKE, "")
        if "Requesting" in shake:
            then = datetime.strptime(shake.split("_")[1], self.fmt)
            if not now < then + timedelta(seconds=60):
                self.node.write("scheduler", {HANDSHAKE: "Deleted_" + now.strftime(self.fmt)})
                self.devices = False
        elif "Deleted" in shake:
            pass  # healthy, no update: the cache stays as it is
        else:
            self.node.write("scheduler", {HANDSHAKE: "Requesting_" + now.strftime(self.fmt)})
            self.devices = True  # needUpdate: the registration is read again


class OurScheduler:
    """Ours (and HAMi >= v2.8 for NVIDIA): a request after anything but a request, never expired
    while the kubelet advertises the GPUs."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.devices = True

    def register_pass(self) -> None:
        if "Requesting" not in self.node.ann.get(HANDSHAKE, ""):
            self.node.write("scheduler", {HANDSHAKE: "Requesting_" + self.node.now().strftime(DASH)})


async def simulate(scheduler_cls, seconds: int = 600, fmt: str | None = None, **registrar_kw):
    """Run the plugin and a scheduler on one node; returns (node, scheduler, outage episodes,
    seconds without devices after the first registration)."""
    node = Node()
    sched = scheduler_cls(node) if fmt is None else scheduler_cls(node, fmt)
    node.on_write = sched.register_pass
    reg = Registrar(FakeKube(node), DeviceState(GPUS, NodeSettings()), clock=node.now, **registrar_kw)
    episodes = dark = next_sync = 0
    had = was_up = False
    for t in range(seconds):
        node.t = t
        if t >= next_sync:
            await reg.sync_once()
            next_sync = t + reg.interval
        if t % 15 == 0:
            sched.register_pass()
        up = sched.devices
        if had and not up:
            dark += 1
            episodes += was_up
        had, was_up = had or up, up
    return node, sched, episodes, dark


def plugin_writes(node: Node) -> list[tuple[int, dict]]:
    return [(t, v) for t, who, v in node.writes if who == "plugin"]


# ---------------------------------------------------------------------- registration_patch


def test_a_request_is_answered_only_when_asked_to():
    state = DeviceState(GPUS, NodeSettings())
    now = datetime(2026, 1, 2, 3, 4, 5)
    written = {k: v for k, v in registration_patch(state, {}, now).items() if v is not None}
    request = {**written, HANDSHAKE: "Requesting_2026-01-02 03:04:00"}
    assert registration_patch(state, request, now) is None  # our scheduler's standing request: no write
    assert registration_patch(state, request, now, answer_requests=True) == {HANDSHAKE: "Reported 2026-01-02 03:04:05"}
    # the dotted form of HAMi before 2025 is a request as well (HAMi tests with strings.Contains)
    dotted = {**written, HANDSHAKE: "Requesting_2026.01.02 03:04:00"}
    assert registration_patch(state, dotted, now, answer_requests=True) == {HANDSHAKE: "Reported 2026-01-02 03:04:05"}
    # nothing to answer: no write, whatever the mode
    assert registration_patch(state, {**written, HANDSHAKE: "Reported x"}, now, answer_requests=True) is None
    assert registration_patch(state, written, now, answer_requests=True) is None


def test_what_shows_a_scheduler_that_expires_requests():
    assert expiring_scheduler("Requesting_2026-03-01 12:00:00", "Deleted_2026-03-01 12:01:00")
    assert expiring_scheduler(None, "Requesting_2026.03.01 12:00:00")  # HAMi before 2025: always expired them
    assert expiring_scheduler("Reported x", "Requesting_2024.11.11 04:14:36")
    # a Deleted_ left from before this plugin started, or after our own Reported: no evidence
    assert not expiring_scheduler(None, "Deleted_2026-03-01 12:01:00")
    assert not expiring_scheduler("Reported 2026-03-01 12:00:00", "Deleted_2026-03-01 12:01:00")
    assert not expiring_scheduler("Deleted_2026-03-01 12:00:00", "Deleted_2026-03-01 12:00:00")
    # our scheduler's request, however old
    assert not expiring_scheduler("Requesting_2026-03-01 12:00:00", "Requesting_2026-03-01 12:00:00")
    assert not expiring_scheduler(None, "")


# ---------------------------------------------------------------------- against a scheduler


async def test_without_an_answer_an_old_hami_scheduler_drops_the_gpus_every_cycle():
    *_, episodes, dark = await simulate(OldHamiScheduler, legacy_handshake="off")
    assert episodes >= 5 and dark >= 100  # what the plugin did before it answered requests


async def test_answering_from_the_start_keeps_an_old_hami_scheduler_from_ever_dropping_the_gpus():
    node, _, episodes, dark = await simulate(OldHamiScheduler, legacy_handshake="on")
    assert (episodes, dark) == (0, 0)
    assert not any("Deleted" in v for _, _, w in node.writes for v in w.values() if v)
    # as HAMi's own plugin of that time: one write per request, a request at most 30 s old
    answers = [t for t, w in plugin_writes(node) if set(w) == {HANDSHAKE}]
    assert len(answers) == 600 // 30 - 1


async def test_by_default_the_plugin_learns_an_old_scheduler_at_its_first_expiry_and_answers_from_then_on():
    node, sched, episodes, dark = await simulate(OldHamiScheduler)
    assert episodes <= 1 and dark <= 30
    deleted = [t for t, who, w in node.writes if who == "scheduler" and "Deleted" in w[HANDSHAKE]]
    assert len(deleted) == 1 and deleted[0] <= 75  # one expiry, then never again
    assert sched.devices


async def test_the_dotted_requests_of_hami_before_2025_are_answered_from_the_first_one():
    *_, episodes, dark = await simulate(OldHamiScheduler, fmt=DOT)
    assert (episodes, dark) == (0, 0)


@pytest.mark.parametrize("mode", ["auto", "off"])
async def test_our_schedulers_standing_request_costs_no_write(mode):
    node, *_ = await simulate(OurScheduler, legacy_handshake=mode)
    writes = plugin_writes(node)
    assert len(writes) == 1 and REGISTER in writes[0][1]  # the registration, at start
    assert [who for _, who, _ in node.writes].count("scheduler") == 1


async def test_a_stale_deleted_at_start_is_answered_without_turning_answers_on():
    node = Node()
    node.ann[HANDSHAKE] = "Deleted_2026-03-01 11:00:00"  # HAMi#1839: left by an old verdict
    reg = Registrar(FakeKube(node), DeviceState(GPUS, NodeSettings()), clock=node.now)
    await reg.sync_once()
    assert node.ann[HANDSHAKE] == "Reported 2026-03-01 12:00:00" and not reg.answering
    node.ann[HANDSHAKE] = "Requesting_2026-03-01 12:00:01"
    node.t = 30
    assert await reg.sync_once() is False


def test_answers_come_often_enough_whatever_the_interval():
    node = Node()
    reg = Registrar(FakeKube(node), DeviceState(GPUS, NodeSettings()), interval=120, legacy_handshake="on")
    assert reg.delay() == ANSWER_WITHIN_S <= 30  # HAMi expires a request after 60 s
    assert Registrar(FakeKube(node), DeviceState(GPUS, NodeSettings()), interval=120).delay() == 120
    assert (
        Registrar(FakeKube(node), DeviceState(GPUS, NodeSettings()), interval=10, legacy_handshake="on").delay() == 10
    )
    with pytest.raises(ValueError):
        Registrar(FakeKube(node), DeviceState(GPUS, NodeSettings()), legacy_handshake="sometimes")


def test_the_flag():
    p = argparse.ArgumentParser()
    dp_command.add_arguments(p)
    assert p.parse_args([]).legacy_handshake == "auto"
    assert p.parse_args(["--legacy-handshake=on"]).legacy_handshake == "on"
    with pytest.raises(SystemExit):
        p.parse_args(["--legacy-handshake=yes"])


def test_the_agent_gives_the_mode_to_its_registrar(tmp_path):
    from hami.deviceplugin.agent import NodeAgent
    from hami.node.layout import HookPaths

    def agent(**kw):
        paths = HookPaths(str(tmp_path / "hook"), str(tmp_path / "lock"))
        return NodeAgent(FakeKube(Node()), NodeSettings(), [], tmp_path, paths, **kw)

    assert agent(legacy_handshake="on").registrar.answering
    assert agent().registrar.legacy_handshake == "auto" and not agent().registrar.answering
