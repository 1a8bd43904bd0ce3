"""The DRA agent's health record (health.json) keeps what an XID said of a GPU, not what NVML
failing said of every GPU: that blanket mark (events not registered, a failed wait) is a fault of
the watcher, which a restart clears; recorded, it held every GPU of the node tainted across
restarts until the node rebooted (with the default --health-recovery 0)."""

from __future__ import annotations

import types

from hami.draplugin.checkpoint import HealthRecord
from hami.draplugin.command import health_watcher
from hami.draplugin.health import HealthBook
from hami.node import nvml
from hami.node.nvml import XidWatcher

BOOT = "0b5e8a2c-1d2f-4a6b-9c3d-5e7f8a9b0c1d"
GPUS = ["GPU-0", "GPU-1"]


def _book(record: HealthRecord) -> HealthBook:
    book = HealthBook(0.0)
    book.restore(*record.load(BOOT))
    book.saved = lambda marks, notes: record.save(BOOT, marks, notes)
    return book


def _nvml(monkeypatch, register=None, waits=()):
    """pynvml's event calls: ``register`` raised by nvmlEventSetCreate; ``waits`` answered in turn
    by nvmlEventSetWait_v2 (an exception is raised)."""
    waits = list(waits)

    def create():
        if register is not None:
            raise register
        return "set"

    def wait(es, ms):
        item = waits.pop(0) if waits else nvml.pynvml.NVMLError(nvml.pynvml.NVML_ERROR_TIMEOUT)
        if isinstance(item, Exception):
            raise item
        return item

    for name, fn in {
        "nvmlEventSetCreate": create,
        "nvmlDeviceGetHandleByUUID": lambda uuid: uuid,
        "nvmlDeviceRegisterEvents": lambda handle, types, es: None,
        "nvmlEventSetWait_v2": wait,
        "nvmlDeviceGetUUID": lambda handle: handle,
        "nvmlEventSetFree": lambda es: None,
    }.items():
        monkeypatch.setattr(nvml.pynvml, name, fn)


def test_nvml_failing_taints_every_gpu_now_but_not_after_a_restart(monkeypatch, tmp_path):
    monkeypatch.delenv("DP_DISABLE_HEALTHCHECKS", raising=False)
    _nvml(monkeypatch, register=nvml.pynvml.NVMLError(nvml.pynvml.NVML_ERROR_UNKNOWN))
    record = HealthRecord(tmp_path / "health.json")
    book, changes = _book(record), []
    watcher = health_watcher(GPUS, book, lambda: changes.append(1))
    watcher._run()  # the thread's body: registering fails, every GPU is marked
    assert book.unhealthy() == set(GPUS) and changes == [1]
    assert _book(record).unhealthy() == set()  # the restarted agent: NVML is tried again


def test_an_xid_is_still_recorded_and_a_later_failure_does_not_drop_it(monkeypatch, tmp_path):
    monkeypatch.delenv("DP_DISABLE_HEALTHCHECKS", raising=False)
    xid79 = types.SimpleNamespace(device="GPU-1", eventType=nvml.pynvml.nvmlEventTypeXidCriticalError, eventData=79)
    failed = nvml.pynvml.NVMLError(nvml.pynvml.NVML_ERROR_GPU_IS_LOST)
    _nvml(monkeypatch, waits=[xid79, failed])
    record = HealthRecord(tmp_path / "health.json")
    book = _book(record)
    watcher = health_watcher(GPUS, book, lambda: None)
    watcher._wait_ms = 0
    event_set = watcher._register()
    watcher._wait_once(event_set)  # XID 79 on GPU-1
    watcher._wait_once(event_set)  # then the wait fails: every GPU
    assert book.unhealthy() == set(GPUS)
    assert _book(record).unhealthy() == {"GPU-1"}  # the XID's mark outlives the restart


def test_the_device_plugin_keeps_one_callback_for_both():
    """Without on_failure (the device plugin, which records nothing) NVML failing is reported
    through on_unhealthy, as before."""
    marked = []
    w = XidWatcher(GPUS, marked.append)
    assert w._on_failure is w._on_unhealthy


def test_a_passing_mark_heals_by_the_recovery_rule_and_is_forgotten():
    now = [0.0]
    book = HealthBook(10.0, lambda uuid: True, clock=lambda: now[0])
    saved = []
    book.saved = lambda marks, notes: saved.append(dict(marks))
    book.mark(GPUS, lasting=False)
    assert saved == []  # nothing to record: no write each period while NVML fails
    now[0] = 11.0
    assert book.recover() == GPUS and book.unhealthy() == set()
    book.mark(["GPU-0"])  # an XID later is recorded as any other
    assert saved[-1].keys() == {"GPU-0"}
