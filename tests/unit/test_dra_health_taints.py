"""A GPU a fatal XID marked unhealthy carries a device taint in the ResourceSlice (KEP-5055), the
taint goes when the GPU recovers, a cluster that drops taints gets the GPU left out instead, and
the simulator keeps claims off a tainted GPU unless they tolerate it, as kube-scheduler does. A
non-fatal XID is recorded as an informational taint (effect ``None``) that keeps no claim off."""

import asyncio

import pytest

from hami.core import SchedulerConfig
from hami.dra import fit
from hami.dra.model import (
    UNHEALTHY_TAINT_KEY,
    GpuMig,
    SliceSettings,
    StaticInstance,
    resource_slice,
    resource_slices,
    unhealthy_taint,
    xid_taint,
)
from hami.draplugin.health import HealthBook
from hami.draplugin.publisher import publish_slice
from hami.kube.client import KubeError
from hami.node import nvml
from hami.node.nvml import PhysicalGPU, XidWatcher
from hami.sim.dra import simulate_dra
from hami.vendors import build_vendors

GPUS = [PhysicalGPU(i, f"GPU-{i}", "Tesla T4", 15360, f"0000:{i + 1:02x}:00.0", 0) for i in range(2)]
S = SliceSettings(split_count=4)
CFG = SchedulerConfig(build_vendors(), "binpack", "spread")


def test_an_unhealthy_gpu_is_tainted_or_left_out():
    spec = resource_slice("n", GPUS, S, unhealthy=frozenset({"GPU-1"}), taint="NoSchedule")["spec"]
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    assert "taints" not in spec["devices"][0]
    assert spec["devices"][1]["taints"] == [{"key": "gpu.hami.io/unhealthy", "value": "xid", "effect": "NoSchedule"}]
    noexec = resource_slice("n", GPUS, S, unhealthy=frozenset({"GPU-1"}), taint="NoExecute")["spec"]
    assert noexec["devices"][1]["taints"][0]["effect"] == "NoExecute"
    left_out = resource_slice("n", GPUS, S, unhealthy=frozenset({"GPU-1"}))["spec"]
    assert [d["name"] for d in left_out["devices"]] == ["gpu-0"]
    with pytest.raises(ValueError, match="effect must be one of NoSchedule, NoExecute, got 'None'"):
        unhealthy_taint("None")


XID_13 = {"key": "gpu.hami.io/xid", "value": "13", "effect": "None"}


def test_a_minor_xid_is_an_informational_taint_beside_the_unhealthy_one():
    spec = resource_slice("n", GPUS, S, notes={"GPU-0": 13})["spec"]
    assert spec["devices"][0]["taints"] == [XID_13] and "taints" not in spec["devices"][1]
    both = resource_slice("n", GPUS, S, unhealthy=frozenset({"GPU-0"}), taint="NoSchedule", notes={"GPU-0": 13})
    assert both["spec"]["devices"][0]["taints"] == [unhealthy_taint("NoSchedule"), XID_13]
    # an unhealthy GPU left out (no taint effect) is left out with its note
    left_out = resource_slice("n", GPUS, S, unhealthy=frozenset({"GPU-0"}), notes={"GPU-0": 13, "GPU-1": 31})
    assert [(d["name"], d["taints"]) for d in left_out["spec"]["devices"]] == [("gpu-1", [{**XID_13, "value": "31"}])]
    for bad in (-1, "13", True):
        with pytest.raises(ValueError, match=f"XID must be a number >= 0, got {bad!r}"):
            xid_taint(bad)


def test_a_minor_xid_taints_the_mig_devices_of_its_gpu():
    a100 = PhysicalGPU(0, "GPU-A", "NVIDIA A100-SXM4-40GB", 40960, "0000:01:00.0", 0)
    mig = {"GPU-A": GpuMig(False, instances=(StaticInstance(1, "1g.5gb", 0, 1, "MIG-1", 4864, 14),))}
    [sl] = resource_slices("n", [a100], S, mig=mig, notes={"GPU-A": 43})
    assert [(d["name"], d.get("taints")) for d in sl["spec"]["devices"]] == [
        (sl["spec"]["devices"][0]["name"], [{**XID_13, "value": "43"}])
    ]


def test_an_informational_taint_keeps_no_claim_off_the_gpu():
    tainted = resource_slice("n", GPUS[:1], S, notes={"GPU-0": 13})
    devs = list(fit.devices_of([tainted]).values())
    requests, constraints = fit.claim_spec_requests(claim_spec(), "c")
    found = fit.allocate_claims(devs, [fit.ClaimAsk("c", requests, constraints)])
    assert [p.device.device for p in found.picks[0]] == ["gpu-0"]


class FakeApi:
    """KubeClient's get/request over one stored ResourceSlice; ``keep_taints`` False plays an API
    server without device taints (the field is dropped on write), ``refuse_none`` one that refuses
    the taint effect ``None`` (before Kubernetes 1.35)."""

    def __init__(self, keep_taints=True, refuse_none=False):
        self.stored = None
        self.keep_taints = keep_taints
        self.refuse_none = refuse_none
        self.writes = []

    async def get(self, path, **query):
        if self.stored is None:
            raise KubeError("GET", path, 404, "not found")
        return self.stored

    async def request(self, method, path, query=None, body=None, content_type=None):
        assert method == "PATCH"
        import copy

        obj = copy.deepcopy(body)
        if self.refuse_none and any(t["effect"] == "None" for d in obj["spec"]["devices"] for t in d.get("taints", ())):
            raise KubeError(method, path, 422, 'spec.devices[0].taints[0].effect: Unsupported value: "None"')
        if not self.keep_taints:
            for d in obj["spec"]["devices"]:
                d.pop("taints", None)
        self.stored = obj
        self.writes.append(obj)
        return obj


def names(obj):
    return [d["name"] for d in obj["spec"]["devices"]]


def test_the_publisher_taints_bumps_the_generation_and_untaints():
    api = FakeApi()
    asyncio.run(publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule"))
    assert api.stored["spec"]["pool"]["generation"] == 1
    got = asyncio.run(publish_slice(api, "n", GPUS, S, frozenset({"GPU-0"}), "", "NoSchedule"))
    assert names(got) == ["gpu-0", "gpu-1"] and got["spec"]["devices"][0]["taints"][0]["key"] == UNHEALTHY_TAINT_KEY
    assert got["spec"]["pool"]["generation"] == 2  # a taint is a change of the pool
    healed = asyncio.run(publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule"))
    assert "taints" not in healed["spec"]["devices"][0] and healed["spec"]["pool"]["generation"] == 3


def test_a_cluster_that_drops_taints_gets_the_unhealthy_gpu_left_out():
    api = FakeApi(keep_taints=False)
    asyncio.run(publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule"))
    got = asyncio.run(publish_slice(api, "n", GPUS, S, frozenset({"GPU-1"}), "", "NoSchedule"))
    assert names(got) == ["gpu-0"]  # never published as if healthy
    assert [names(w) for w in api.writes[1:]] == [["gpu-0", "gpu-1"], ["gpu-0"]]


def test_a_fallback_is_told_so_later_publishes_never_show_the_unhealthy_gpu_untainted():
    """Each publish first wrote the unhealthy GPU with its taint, which the API server dropped:
    for a moment the slice named it healthy. The caller is told, and leaves the taint (and the
    GPU) out from the start. Found by an adversarial review."""
    api = FakeApi(keep_taints=False)
    told: list[str] = []
    asyncio.run(publish_slice(api, "n", GPUS, S, frozenset({"GPU-1"}), "", "NoSchedule", fell_back=told.append))
    assert told == ["taints"]
    before = len(api.writes)
    asyncio.run(publish_slice(api, "n", GPUS, S, frozenset({"GPU-1"}), "", None))  # what the caller does next
    assert [names(w) for w in api.writes[before:]] == [["gpu-0"]]
    told.clear()
    api = FakeApi(refuse_none=True)
    asyncio.run(
        publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule", notes={"GPU-0": 13}, fell_back=told.append)
    )
    assert told == ["notes"]


def test_a_failed_republish_is_tried_again_without_another_change():
    """A republish that failed was only logged, and with no recovery timer the loop waited for the
    next event: a GPU just marked unhealthy stayed published healthy. Found by an adversarial review."""
    from hami.draplugin import command

    async def run() -> list[str]:
        stop, changed = asyncio.Event(), asyncio.Event()
        calls: list[str] = []

        class Book:
            def due(self):
                return None

            def recover(self):
                return False

            def forget(self):
                return False

        class Feed:
            async def changed(self):
                pass

        async def publish():
            calls.append("publish")
            if len(calls) < 3:
                raise OSError("connection reset")  # not only the API's own errors
            stop.set()

        changed.set()
        await asyncio.wait_for(command.republish_on_change(stop, changed, Book(), Feed(), publish), 10)
        return calls

    saved = command.REPUBLISH_RETRY_S
    command.REPUBLISH_RETRY_S = 0.01
    try:
        assert asyncio.run(run()) == ["publish"] * 3
    finally:
        command.REPUBLISH_RETRY_S = saved


def test_the_publisher_writes_a_minor_xid_and_falls_back_where_the_cluster_cannot_keep_it():
    api = FakeApi()
    asyncio.run(publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule"))
    got = asyncio.run(publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule", notes={"GPU-1": 13}))
    assert got["spec"]["devices"][1]["taints"] == [XID_13] and got["spec"]["pool"]["generation"] == 2
    # taints dropped by the API server: the informational one goes too, nothing is left out for it
    api = FakeApi(keep_taints=False)
    got = asyncio.run(publish_slice(api, "n", GPUS, S, frozenset({"GPU-0"}), "", "NoSchedule", notes={"GPU-1": 13}))
    assert names(got) == ["gpu-1"] and "taints" not in got["spec"]["devices"][0]
    # effect None refused (422): published again with the unhealthy taint only
    api = FakeApi(refuse_none=True)
    got = asyncio.run(publish_slice(api, "n", GPUS, S, frozenset({"GPU-0"}), "", "NoSchedule", notes={"GPU-0": 13}))
    assert got["spec"]["devices"][0]["taints"] == [unhealthy_taint("NoSchedule")]


class RefusingApi(FakeApi):
    async def request(self, method, path, query=None, body=None, content_type=None):
        self.writes.append(body)
        raise KubeError(method, path, 422, "spec.devices: Too many")


def test_a_refusal_that_is_not_about_the_xid_taint_reaches_the_caller():
    api = RefusingApi()
    with pytest.raises(KubeError, match="Too many"):
        asyncio.run(publish_slice(api, "n", GPUS, S, frozenset(), "", "NoSchedule", notes={"GPU-0": 13}))
    assert [[d.get("taints") for d in w["spec"]["devices"]] for w in api.writes] == [[[XID_13], None], [None, None]]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_gpu_recovers_after_the_quiet_period_if_nvml_answers():
    clock, answering = Clock(), {"GPU-0": False, "GPU-1": True}
    book = HealthBook(60, lambda u: answering[u], clock)
    assert book.due() is None and book.recover() == []
    book.mark(["GPU-0", "GPU-1"])
    assert book.unhealthy() == {"GPU-0", "GPU-1"} and book.due() == 60
    clock.now += 30
    book.mark(["GPU-1"])  # a new XID starts its wait again
    clock.now += 30
    assert book.recover() == []  # GPU-0's probe fails: it waits another period
    assert book.unhealthy() == {"GPU-0", "GPU-1"} and book.due() == 30
    clock.now += 30
    assert book.recover() == ["GPU-1"] and book.unhealthy() == {"GPU-0"}
    answering["GPU-0"] = True
    clock.now += 30
    assert book.recover() == ["GPU-0"] and book.unhealthy() == frozenset() and book.due() is None


def test_without_recovery_a_gpu_stays_unhealthy_and_a_raising_probe_is_not_back():
    clock = Clock()
    book = HealthBook(0, lambda u: True, clock)
    book.mark(["GPU-0"])
    clock.now += 1e6
    assert book.due() is None and book.recover() == [] and book.unhealthy() == {"GPU-0"}

    def broken(uuid):
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    book = HealthBook(5, broken, clock)
    book.mark(["GPU-0"])
    clock.now += 5
    assert book.recover() == [] and book.unhealthy() == {"GPU-0"}
    with pytest.raises(ValueError, match="recovery must be >= 0"):
        HealthBook(-1)


def test_a_minor_xid_is_noted_not_marked_and_forgotten_after_the_quiet_period():
    clock = Clock()
    book = HealthBook(60, lambda u: True, clock)
    book.note("GPU-0", 13)
    assert book.unhealthy() == frozenset() and book.notes() == {"GPU-0": 13} and book.due() == 60
    clock.now += 40
    book.note("GPU-0", 31)  # the last one wins, its wait starts again
    book.mark(["GPU-1"])
    clock.now += 30
    assert book.forget() == [] and book.notes() == {"GPU-0": 31} and book.due() == 30
    clock.now += 30
    assert book.forget() == ["GPU-0"] and book.notes() == {}
    assert book.recover() == ["GPU-1"] and book.due() is None
    forever = HealthBook(0, lambda u: True, clock)
    forever.note("GPU-0", 13)
    clock.now += 1e6
    assert forever.forget() == [] and forever.notes() == {"GPU-0": 13} and forever.due() is None


def test_the_same_minor_xid_again_is_not_written_again():
    """A faulting kernel reports its XID as often as it runs: each note was a health.json write
    with an fsync (found by review). The same XID on the same GPU moves its time on in memory,
    and is written again once the saved time is half the quiet period old (so a restart keeps
    the note: restored with its saved time, it is not forgotten at once)."""
    clock, saves = Clock(), []
    book = HealthBook(60, lambda u: True, clock, saved=lambda marks, notes: saves.append(dict(notes)))
    for _ in range(6):  # at 0, 10, ..., 50 s
        book.note("GPU-0", 13)
        clock.now += 10
    assert len(saves) == 2 and book.due() == 60 - 10  # written at 0 and 30 s; the last note's wait
    book.note("GPU-0", 43)
    assert len(saves) == 3 and saves[-1]["GPU-0"][0] == 43


def test_minor_xid_republishes_are_paced():
    """Notes alternating 13 and 43 changed the slice's taint each time: one ResourceSlice write
    per XID, each one every slice watcher reacts to (found by review). One at once, then at most
    one per window, the last one never lost."""
    import threading
    import time

    from hami.draplugin.command import Pacer

    fired: list[float] = []
    done = threading.Event()
    pacer = Pacer(0.3, lambda: fired.append(time.monotonic()) or (len(fired) == 2 and done.set()))
    began = time.monotonic()
    for _ in range(50):
        pacer.signal()
    assert len(fired) == 1
    assert done.wait(5)
    assert len(fired) == 2 and fired[1] - began >= 0.3
    time.sleep(0.35)
    pacer.signal()  # a window later: at once
    assert len(fired) == 3


class FakeEvents:
    """pynvml's event calls over a list of (UUID, event type, XID) events, for :class:`XidWatcher`."""

    def __init__(self, monkeypatch, events):
        self.events = list(events)
        for name, fn in {
            "nvmlEventSetCreate": lambda: "set",
            "nvmlDeviceGetHandleByUUID": lambda uuid: uuid,
            "nvmlDeviceRegisterEvents": lambda handle, types, es: None,
            "nvmlEventSetWait_v2": self.wait,
            "nvmlDeviceGetUUID": lambda handle: handle,
            "nvmlEventSetFree": lambda es: None,
        }.items():
            monkeypatch.setattr(nvml.pynvml, name, fn)

    def wait(self, es, ms):
        import types

        if not self.events:
            raise nvml.pynvml.NVMLError(nvml.pynvml.NVML_ERROR_TIMEOUT)
        uuid, kind, xid = self.events.pop(0)
        return types.SimpleNamespace(device=uuid, eventType=kind, eventData=xid)


def test_the_watcher_reports_a_minor_xid_apart_from_a_fatal_one(monkeypatch):
    import threading

    critical = nvml.pynvml.nvmlEventTypeXidCriticalError
    FakeEvents(
        monkeypatch,
        [
            ("GPU-0", critical, 13),  # an application error: noted
            ("GPU-1", nvml.pynvml.nvmlEventTypeSingleBitEccError, 0),  # not an XID: neither
            ("GPU-X", critical, 31),  # not one of ours: neither
            ("GPU-1", critical, 79),  # a fault: unhealthy
            ("GPU-1", critical, 48),  # disabled by DP_DISABLE_HEALTHCHECKS=48: noted
        ],
    )
    marked, noted, done = [], [], threading.Event()

    def on_unhealthy(uuids):
        marked.append(uuids)

    def on_minor(uuid, xid):
        noted.append((uuid, xid))
        if xid == 48:
            done.set()

    ignored = nvml.ignored_xids({"DP_DISABLE_HEALTHCHECKS": "48"})
    w = XidWatcher(["GPU-0", "GPU-1"], on_unhealthy, ignored, wait_ms=10, on_minor=on_minor)
    w.start()
    done.wait()
    w.stop()
    assert noted == [("GPU-0", 13), ("GPU-1", 48)] and marked == [["GPU-1"]]


# ------------------------------------------------------------------ the allocator's rule


def claim_spec(tolerations=None, mode=None):
    exactly = {"deviceClassName": "gpu.hami.io", "capacity": {"requests": {"memory": "1Gi"}}}
    if tolerations is not None:
        exactly["tolerations"] = tolerations
    if mode:
        exactly["allocationMode"] = mode
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def place(spec, taint="NoSchedule", unhealthy=("GPU-0",)):
    devs = list(fit.devices_of([resource_slice("n", GPUS, S, unhealthy=frozenset(unhealthy), taint=taint)]).values())
    requests, constraints = fit.claim_spec_requests(spec, "c")
    found = fit.allocate_claims(devs, [fit.ClaimAsk("c", requests, constraints)])
    return None if found.picks is None else [p.device.device for p in found.picks[0]], devs, requests


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_a_tainted_gpu_is_passed_over_unless_tolerated(effect):
    got, devs, requests = place(claim_spec(), effect)
    assert got == ["gpu-1"]
    assert fit.device_why(devs[0], requests[0]) == f"taint gpu.hami.io/unhealthy=xid:{effect} not tolerated"
    for tol in (
        [{"key": "gpu.hami.io/unhealthy", "operator": "Exists"}],
        [{"key": "gpu.hami.io/unhealthy", "value": "xid"}],
        [{"operator": "Exists", "effect": effect}],
        [{"operator": "Exists"}],
    ):
        assert place(claim_spec(tol), effect)[0] == ["gpu-0"], tol
    for tol in (
        [{"key": "gpu.hami.io/unhealthy", "value": "other"}],
        [{"key": "other", "operator": "Exists"}],
        [{"operator": "Exists", "effect": "NoExecute" if effect == "NoSchedule" else "NoSchedule"}],
    ):
        assert place(claim_spec(tol), effect)[0] == ["gpu-1"], tol


def test_all_mode_with_a_tainted_gpu_fails_as_the_allocator_does():
    assert place(claim_spec(mode="All"))[0] is None
    assert place(claim_spec(mode="All"), unhealthy=())[0] == ["gpu-0", "gpu-1"]
    assert place(claim_spec([{"operator": "Exists"}], mode="All"))[0] == ["gpu-0", "gpu-1"]


def test_a_bad_toleration_operator_is_refused_by_name():
    with pytest.raises(fit.ClaimError, match=r"tolerations\[0\].operator: 'Maybe' is not Equal or Exists"):
        fit.claim_spec_requests(claim_spec([{"operator": "Maybe"}]), "c")


def test_the_simulator_reads_taints_from_given_slices():
    tainted = resource_slice("n", GPUS[:1], S, unhealthy=frozenset({"GPU-0"}), taint="NoSchedule")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "m", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
    }
    [out] = simulate_dra([tainted], [pod], CFG).pods
    assert out.status == "pending" and "not tolerated" in out.reasons["n"]


def test_the_recovery_probe_and_its_record_run_off_the_event_loop():
    """A marked GPU's recovery asks NVML about it (a call a failing GPU can stall) and writes the
    record with an fsync: neither may hold the agent's event loop (its gRPC and health stream)."""
    import threading

    from hami.draplugin import command

    threads: list[str] = []
    clock = [0.0]

    def probe(uuid):
        threads.append(f"probe {threading.current_thread() is threading.main_thread()}")
        return True

    def saved(marks, notes):
        threads.append(f"save {threading.current_thread() is threading.main_thread()}")

    book = HealthBook(recovery=5, probe=probe, clock=lambda: clock[0], saved=saved)
    book.mark(["GPU-0"])
    threads.clear()
    clock[0] = 10

    class Feed:
        async def changed(self):
            pass

    async def run():
        stop, changed = asyncio.Event(), asyncio.Event()

        async def publish():
            stop.set()

        await asyncio.wait_for(command.republish_on_change(stop, changed, book, Feed(), publish), 10)

    asyncio.run(run())
    assert book.unhealthy() == frozenset()
    assert threads == ["probe False", "save False"]  # was True, True: on the loop's thread
