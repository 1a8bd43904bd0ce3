"""Regression review of the scheduler's allocation metrics with the DRA front end: a MIG GPU
registered by both front ends keeps the extender's allocations, and the DRA counting runs where
the text is formatted (a worker thread), not on the scheduler's event loop."""

from __future__ import annotations

import dataclasses
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from hami.core.ledger import make_allocation
from hami.core.types import ContainerDevice
from hami.dra.model import SliceSettings, resource_slices
from hami.scheduler import metrics as m
from hami.scheduler.metrics import SchedulerMetrics, snapshot_of
from hami.scheduler.state import ClusterState

from . import _corekit as kit
from ._vendorkit import config
from .test_dra_claims import claim
from .test_dra_mig import A100, DYNAMIC, GPUS

MIB = 1 << 20


def _mig_on_both() -> ClusterState:
    """The A100 registered by the extender (a 2000 MiB pod on it) and published by the DRA agent
    as dynamic MIG placements, one 3g.20gb (19968 MiB) claimed."""
    s = ClusterState(config())
    n = kit.node("n1", 1, mem=40960)
    s.ledger.set_node(dataclasses.replace(n, devices=(dataclasses.replace(n.devices[0], id=A100),)))
    pod = kit.pod("ext", [kit.ctr(mem=2000, cores=20)], ns="team-a")
    s.ledger.add_pod(make_allocation(pod, "n1", {"NVIDIA": ((ContainerDevice(A100, "NVIDIA", 2000, 20),),)}))
    s.slice_handler.replace(resource_slices("n1", GPUS, SliceSettings(split_count=4), mig=DYNAMIC))
    s.claim_handler.replace(
        [claim("m", results=[{"request": "gpu", "driver": "gpu.hami.io", "pool": "n1", "device": "gpu-0-3g-20gb-0"}])]
    )
    return s


def test_a_mig_gpu_the_extender_registers_too_keeps_the_extenders_allocations():
    text = SchedulerMetrics(lambda: snapshot_of(_mig_on_both())).render().decode()
    lines = [ln.rsplit(" ", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert [k for k, n in Counter(lines).items() if n > 1] == []
    got = {f.name: f.samples for f in text_string_to_metric_families(text)}

    def one(name):
        [value] = [x.value for x in got[name] if x.labels["device_uuid"] == A100]
        return value

    # was 19968 MiB and 1: the DRA row replaced the extender's, its 2000 MiB pod gone
    assert one("hami_gpu_memory_allocated_bytes") == (2000 + 19968) * MIB
    assert one("hami_gpu_shared_count") == 2
    assert one("hami_gpu_core_allocated_ratio") == 20 + 43  # 3g.20gb: 43 of 100 cores
    assert one("hami_gpu_memory_limit_bytes") == 40960 * MIB  # the extender's registration
    pods = {x.labels["pod"]: x.value for x in got["hami_vgpu_memory_allocated_bytes"]}
    assert pods == {"ext": 2000 * MIB, "p": 19968 * MIB}


def test_the_dra_counting_runs_in_render_not_in_the_copy_taken_on_the_loop(monkeypatch):
    calls = []
    real = m._with_dra
    monkeypatch.setattr(m, "_with_dra", lambda *a: calls.append(1) or real(*a))
    metrics = SchedulerMetrics(lambda: snapshot_of(_mig_on_both()))
    rows = metrics.rows()  # on the scheduler's loop: a copy only
    assert calls == []
    assert b"gpu-0-3g-20gb" not in metrics.render(rows) and calls == [1]


def test_a_dra_gpu_without_an_index_attribute_is_numbered_by_its_device_names():
    """Slices without the ``index`` attribute (an older or foreign agent): the metrics, /nodes and
    the grants number a GPU by the ``gpu-N`` its device names start with; the metrics took the
    name's last number, a MIG placement's start (0 for GPU 2's first placement)."""
    gpus = [dataclasses.replace(GPUS[0], index=2), dataclasses.replace(GPUS[1], index=3)]
    slices = resource_slices("n1", gpus, SliceSettings(split_count=4), mig=DYNAMIC)
    for s in slices:
        for d in s["spec"].get("devices", ()):
            d["attributes"].pop("index")
    s = ClusterState(config())
    s.slice_handler.replace(slices)
    assert {k[1]: d["index"] for k, d in s.dra_devices.items()} == {
        k[1]: 2 if k[1].startswith("gpu-2-") else 3 for k in s.dra_devices
    }
    text = SchedulerMetrics(lambda: snapshot_of(s)).render().decode()
    got = {
        x.labels["device_uuid"]: x.labels["device_index"]
        for f in text_string_to_metric_families(text)
        if f.name == "hami_gpu_memory_limit_bytes"
        for x in f.samples
    }
    assert got == {A100: "2", GPUS[1].uuid: "3"}


def test_the_dra_simulation_numbers_an_unindexed_gpu_as_the_live_views_do():
    """`hami simulate --front-end dra` said 0 for every GPU without an ``index`` attribute, while
    the scheduler's metrics and /nodes (hami.dra.claims.gpu_index) read the gpu-N of its name."""
    from hami.sim.dra import simulate_dra

    gpus = [dataclasses.replace(GPUS[1], index=3)]
    slices = resource_slices("n1", gpus, SliceSettings(split_count=4))
    for s in slices:
        for d in s["spec"].get("devices", ()):
            d["attributes"].pop("index")
    r = simulate_dra(slices, [], config())
    assert [(d["device"], d["index"]) for d in r.devices] == [("gpu-3", 3)]  # was 0
