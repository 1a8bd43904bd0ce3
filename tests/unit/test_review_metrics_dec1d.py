"""Found by review, 1 Dec: the UI's live-usage scrape parsed every node monitor's whole page on
the scheduler's event loop; the scheduler's core ratio metrics were raw vendor units (an AMD GPU's
304 compute units) where HAMi exports a percentage of the GPU; MIG grants never got live usage."""

from __future__ import annotations

import dataclasses
import threading

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from hami import metricnames as M
from hami.core.ledger import make_allocation
from hami.core.types import ContainerDevice, DeviceInfo, NodeDevices, Slice
from hami.dra.model import GpuMig, SliceSettings, StaticInstance, resource_slices
from hami.scheduler.metrics import AllocationSnapshot, SchedulerMetrics
from hami.scheduler.state import ClusterState
from hami.ui import live
from hami.ui.model import Snapshot, pods_document

from . import _corekit as kit
from ._vendorkit import config
from .test_dra_claims import claim
from .test_dra_mig import A100, GPUS
from .test_ui_auth import ADMIN, _client
from .test_ui_auth import shared as _shared_state
from .test_ui_live import METRICS, NODE
from .test_ui_prometheus import SERIES, FakePrometheus, _close, _setup, bearer

shared = _shared_state
MIB = 1 << 20
READ = (M.HOST_MEMORY_USED, M.HOST_UTILIZATION, M.CONTAINER_MEMORY_USED, M.CONTAINER_UTILIZATION)


# ------------------------------------------------------------------ 1. live usage off the loop


def _padding(megabytes: int) -> str:
    """Other families of a monitor's page (what it exports besides the four the UI reads)."""
    lines = []
    for name in ("hami_vgpu_memory_limit_bytes", "hami_container_last_kernel_elapsed_seconds"):
        lines += [f"# HELP {name} not read by the UI", f"# TYPE {name} gauge"]
    i, size = 0, 0
    while size < megabytes * MIB:
        for name in ("hami_vgpu_memory_limit_bytes", "hami_container_last_kernel_elapsed_seconds"):
            lines.append(
                f'{name}{{namespace="ns",pod="filler-{i}",container="c",vdevice_index="0",'
                f'device_uuid="GPU-a",zone="vGPU"}} {i}'
            )
            size += len(lines[-1]) + 1
        i += 1
    return "\n".join(lines) + "\n"


async def _serve(pages: dict[str, str]):
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=pages[request.match_info["node"]], content_type="text/plain")

    app = web.Application()
    app.add_routes([web.get("/metrics/{node}", metrics)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/metrics/{{node}}"


async def test_a_page_padded_with_other_families_is_parsed_off_the_loop_from_its_usage_lines_only(monkeypatch):
    """Found by review, 1 Dec: a monitor page (or anything answering on its hostPort) was parsed
    whole on the event loop (16 MiB: ~7 s of Filter and Bind held). Scenario: a page padded with
    3 MiB of families the UI does not read gives the same usage; the parser sees only the four
    families' lines, in a worker thread."""
    calls: list[tuple[str, int]] = []
    real = live.parse_metrics

    def spy(text: str):
        calls.append((text, threading.get_ident()))
        return real(text)

    monkeypatch.setattr(live, "parse_metrics", spy)
    padded = METRICS + _padding(3)
    assert len(padded) > 3 * MIB
    runner, url = await _serve({"n1": padded})
    loop_thread = threading.get_ident()
    try:
        scraper = live.LiveUsage(url, lambda: [("n1", NODE)], timeout=10)
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_all(session)
    finally:
        await runner.cleanup()
    reading = scraper.readings["n1"]
    assert reading.error is None
    assert (reading.devices, reading.containers) == real(METRICS)  # the same usage as the plain page
    [(text, thread)] = calls
    assert thread != loop_thread  # parsed in a worker thread, not on the scheduler's event loop
    assert len(text) < 2000 and "filler" not in text and "hami_vgpu_memory_limit_bytes" not in text
    for line in text.splitlines():
        assert line.startswith(READ) or line.split(" ")[2] in READ, line


async def test_a_node_with_too_many_usage_series_is_an_error_and_the_others_are_read(monkeypatch):
    """Found by review, 1 Dec: one node's page could hold the parsing for seconds. Scenario: a node
    answering with more usage series than one node may have parsed gets an error naming the size
    (its last values kept), the other node is read."""
    monkeypatch.setattr(live, "MAX_PARSED_BYTES", 20_000)
    many = "".join(
        f'hami_vgpu_memory_used_bytes{{namespace="ns",pod="p{i}",container="c",device_uuid="GPU-a"}} 1\n'
        for i in range(1000)
    )
    runner, url = await _serve({"hostile": many, "n1": METRICS})
    try:
        scraper = live.LiveUsage(url, lambda: [("hostile", NODE), ("n1", NODE)], timeout=10)
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_all(session)
    finally:
        await runner.cleanup()
    hostile, good = scraper.readings["hostile"], scraper.readings["n1"]
    assert hostile.scraped_at is None and hostile.containers == {}
    assert hostile.error == f"ValueError: {len(many)} bytes of usage series, more than the 20000 parsed for one node"
    assert good.error is None and good.devices["GPU-a"].memory_mib == 3072


async def test_a_pass_parses_a_bounded_amount_and_the_node_left_out_goes_first_next_pass(monkeypatch):
    """Found by review, 1 Dec: no bound on the parsing of one pass. Scenario: a pass's budget is
    one page; the second node is not parsed in the first pass (said in its error) and is read
    first in the next one, the first node then waiting with its last values."""
    monkeypatch.setattr(live, "PASS_PARSE_BYTES", len(live.usage_lines(METRICS)))
    runner, url = await _serve({"a": METRICS, "b": METRICS})
    clock = [1000.0]
    try:
        scraper = live.LiveUsage(url, lambda: [("a", NODE), ("b", NODE)], concurrency=1, clock=lambda: clock[0])
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_all(session)
            a, b = scraper.readings["a"], scraper.readings["b"]
            assert a.error is None and a.scraped_at == 1000.0
            assert b.scraped_at is None and "this pass already parsed" in (b.error or "")
            clock[0] += 15
            await scraper.scrape_all(session)
    finally:
        await runner.cleanup()
    assert b.error is None and b.scraped_at == 1015.0 and b.devices["GPU-a"].memory_mib == 3072
    assert "this pass already parsed" in (a.error or "") and a.devices["GPU-a"].memory_mib == 3072


async def test_a_page_that_is_not_prometheus_text_is_still_an_error():
    """The filter drops other families' lines, never garbage: an HTML page is the node's error."""
    runner, url = await _serve({"n1": "<!doctype html>\n<p>not the monitor</p>\n"})
    try:
        scraper = live.LiveUsage(url, lambda: [("n1", NODE)], timeout=10)
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_all(session)
    finally:
        await runner.cleanup()
    assert (scraper.readings["n1"].error or "").startswith("ValueError: line 1 is not Prometheus text")


# ------------------------------------------------------------------ 2. core ratios as percentages


def _amd(node: str, i: int) -> DeviceInfo:
    return DeviceInfo(
        id=f"AMD-{node}-{i}", index=i, count=4, devmem=196608, devcore=304, type="AMD-MI300X", vendor="AMD"
    )


def test_core_ratio_families_are_a_percentage_of_the_gpu_and_the_legacy_names_stay_raw():
    """Found by review, 1 Dec: hami_gpu_core_limit_ratio exported an AMD GPU's 304 compute units and
    the allocated families its raw counts, where HAMi's scheduler exports 100 and a percentage for
    every vendor. Scenario: an AMD MI300X (304 CUs) with a 25% share (76 CUs), an NVIDIA GPU with
    deviceCoreScaling 2 (200 cores) holding 150, one of 100 holding 7."""
    led = kit.ledger(
        NodeDevices("amd", (_amd("amd", 0),)),
        NodeDevices("nv", (kit.gpu("nv", 0, cores=200), kit.gpu("nv", 1, cores=100))),
    )
    for name, node, vendor, uuid, cores in (
        ("quarter", "amd", "AMD", "AMD-amd-0", 76),
        ("scaled", "nv", "NVIDIA", "GPU-nv-0", 150),
        ("seven", "nv", "NVIDIA", "GPU-nv-1", 7),
    ):
        pod = kit.pod(name, ns="team")
        led.add_pod(make_allocation(pod, node, {vendor: ((ContainerDevice(uuid, vendor, 1000, cores),),)}))
    text = SchedulerMetrics(lambda: AllocationSnapshot(led, kit.CONFIG.vendors), legacy=True).render().decode()
    got = {f.name: f.samples for f in text_string_to_metric_families(text)}

    def by(name: str, label: str) -> dict[str, float]:
        return {s.labels[label]: s.value for s in got[name]}

    assert by("hami_gpu_core_limit_ratio", "device_uuid") == {"AMD-amd-0": 100, "GPU-nv-0": 100, "GPU-nv-1": 100}
    assert by("hami_gpu_core_allocated_ratio", "device_uuid") == {"AMD-amd-0": 25, "GPU-nv-0": 75, "GPU-nv-1": 7}
    assert by("hami_vgpu_core_allocated_ratio", "pod") == {"quarter": 25, "scaled": 75, "seven": 7}
    # the legacy names keep the vendor's unit, as HAMi's
    assert by("GPUDeviceCoreLimit", "deviceuuid") == {"AMD-amd-0": 304, "GPU-nv-0": 200, "GPU-nv-1": 100}
    assert by("GPUDeviceCoreAllocated", "deviceuuid") == {"AMD-amd-0": 76, "GPU-nv-0": 150, "GPU-nv-1": 7}
    assert by("vGPUCoreAllocated", "podname") == {"quarter": 76, "scaled": 150, "seven": 7}
    # device_cores stays the registered cores: what the UI's history turns percentages back with
    assert by("hami_gpu_memory_allocated_bytes", "device_uuid") and {
        s.labels["device_uuid"]: s.labels["device_cores"] for s in got["hami_gpu_memory_allocated_bytes"]
    } == {"AMD-amd-0": "304", "GPU-nv-0": "200", "GPU-nv-1": "100"}


@pytest.mark.parametrize(
    "total, used, expected",
    [
        (304, 76, (100, 25)),
        (304, 30, (100, 10)),
        (100, 7, (100, 7)),
        (200, 1, (100, 1)),
        (0, 0, (0, 0)),
        (20, 3, (100, 15)),
    ],
)
def test_core_percent_rounds_up_exactly(total, used, expected):
    """7 of 100 is 7 (a float 7 / 100 * 100 is 7.000000000000001, whose ceiling is 8)."""
    from hami.scheduler.metrics import core_percent

    assert core_percent(total, used) == expected


async def test_history_from_prometheus_gives_cores_in_the_vendors_unit(shared, monkeypatch):
    """Found by review, 1 Dec: with the ratio families a percentage, the history's coresAllocated
    read from Prometheus must still be in the vendor's unit the UI documents (the ring's). Scenario:
    an AMD GPU of 304 CUs (device_cores) with a pod holding 25% of it: 76 CUs for the pod, the
    GPU and (with the NVIDIA pod's 20 of 100) its namespace."""
    amd_pod = {"namespace": "team-a", "node": "amd-n", "pod": "rocm", "container_index": "0", "device_uuid": "AMD-1"}
    amd_gpu = {"node": "amd-n", "device_uuid": "AMD-1", "device_type": "AMD-MI300X"}
    monkeypatch.setitem(
        SERIES, "hami_vgpu_memory_allocated_bytes", SERIES["hami_vgpu_memory_allocated_bytes"] + [(amd_pod, 4000 * MIB)]
    )
    monkeypatch.setitem(
        SERIES, "hami_vgpu_core_allocated_ratio", SERIES["hami_vgpu_core_allocated_ratio"] + [(amd_pod, 25)]
    )
    monkeypatch.setitem(
        SERIES,
        "hami_gpu_memory_allocated_bytes",
        SERIES["hami_gpu_memory_allocated_bytes"] + [({**amd_gpu, "device_cores": "304"}, 4000 * MIB)],
    )
    monkeypatch.setitem(
        SERIES, "hami_gpu_core_allocated_ratio", SERIES["hami_gpu_core_allocated_ratio"] + [(amd_gpu, 25)]
    )
    prom = FakePrometheus()
    api, server = await _setup(shared, prom)
    client = await _client(api)
    try:
        docs = {}
        for kind in ("pod", "gpu", "namespace"):
            r = await client.get(f"/api/v1/history?kind={kind}&range=1h", headers=bearer(ADMIN))
            docs[kind] = await r.json()
            assert r.status == 200 and docs[kind]["source"] == "prometheus", docs[kind]
    finally:
        await _close(prom, server, client)

    def cores(kind: str, key: str) -> float:
        [item] = [i for i in docs[kind]["items"] if i["key"] == key]
        return item["points"]["coresAllocated"][-1]

    assert cores("pod", "team-a/rocm") == 76 and cores("gpu", "AMD-1") == 76
    assert cores("pod", "team-a/mine") == 20  # an NVIDIA GPU of 100 cores: percent is its unit
    assert cores("namespace", "team-a") == 96


# ------------------------------------------------------------------ 3. MIG grants' live usage


def _reading(key: tuple[str, str, str, str]) -> dict[str, live.NodeReading]:
    return {"n1": live.NodeReading(scraped_at=100.0, containers={key: live.Usage(memory_mib=300, utilization=12.5)})}


def test_an_extender_mig_grant_shows_the_live_usage_of_its_instance():
    """Found by review, 1 Dec: the monitor labels a MIG container's series with its instance's
    MIG-... UUID (the grant's), the UI looked them up by the GPU's: a MIG grant never had live
    usage. Scenario: a 3g.20gb grant whose instance MIG-x the device plugin made."""
    led = kit.ledger(NodeDevices("n1", (kit.mig_gpu("n1", 0),)))
    instance = Slice("GPU-n1-0", "3g.20gb", 4, 4, mig_uuid="MIG-x", gpu_instance_id=2, compute_instance_id=0)
    pod = kit.pod("train", ns="team")
    led.add_pod(
        make_allocation(pod, "n1", {"NVIDIA": ((ContainerDevice("GPU-n1-0", "NVIDIA", 19968, 39, slice=instance),),)})
    )
    source = Snapshot(led, kit.CONFIG.vendors)
    doc = pods_document(source, 110.0, _reading(("team", "train", "0", "MIG-x")))
    [item] = doc["items"]
    [grant] = item["containers"][0]["grants"]
    assert grant["uuid"] == "GPU-n1-0" and grant["slice"]["profile"] == "3g.20gb"  # shown on its GPU
    assert grant["usage"] == {"state": "live", "memoryUsedMiB": 300, "utilizationPercent": 12.5}
    # a grant whose instance is not made yet is still looked up by its GPU
    plain = dataclasses.replace(instance, mig_uuid="")
    led.remove_pod(led.pods()[0].key)
    led.add_pod(
        make_allocation(pod, "n1", {"NVIDIA": ((ContainerDevice("GPU-n1-0", "NVIDIA", 19968, 39, slice=plain),),)})
    )
    doc = pods_document(source, 110.0, _reading(("team", "train", "0", "GPU-n1-0")))
    assert doc["items"][0]["containers"][0]["grants"][0]["usage"]["memoryUsedMiB"] == 300


def test_a_dra_claim_on_a_static_mig_instance_shows_its_live_usage():
    """Found by review, 1 Dec: a DRA MIG claim's usage was looked up by the GPU's UUID, while the
    claim's record (and so the monitor's series) names the instance's MIG-... UUID. Scenario: a
    claim on a static 3g.20gb instance MIG-static-3, shown on its GPU with the instance's usage."""
    s = ClusterState(config())
    mig = {A100: GpuMig(False, instances=(StaticInstance(3, "3g.20gb", 4, 4, "MIG-static-3", 19968, 43),))}
    s.slice_handler.replace(resource_slices("n1", GPUS, SliceSettings(split_count=4), mig=mig))
    s.claim_handler.replace(
        [claim("m", results=[{"request": "gpu", "driver": "gpu.hami.io", "pool": "n1", "device": "gpu-0-mig-3"}])]
    )
    doc = pods_document(s, 110.0, _reading(("team-a", "p", "m", "MIG-static-3")))
    [item] = [i for i in doc["items"] if i["frontEnd"] == "dra"]
    [grant] = item["containers"][0]["grants"]
    assert grant["uuid"] == A100 and grant["slice"]["profile"] == "3g.20gb"  # displayed on its GPU
    assert grant["usage"] == {"state": "live", "memoryUsedMiB": 300, "utilizationPercent": 12.5}


def test_neuron_core_ratios_count_the_cores_a_mask_names():
    """Regression review, 1 Dec: AWS Neuron registers and grants cores as bitmasks, and the new
    percentages divided the masks: one NeuronCore of an Inf2's two (0b11) read 34 or 67 % by which
    bit it was, one of an Inf1's four (0b1111) 7 to 54 %. Each is 50 and 25 % of its device."""
    inf2 = DeviceInfo(id="NEURON-n-0", index=0, count=2, devmem=32768, devcore=0b11, type="Inf2", vendor="AWSNeuron")
    inf1 = DeviceInfo(id="NEURON-n-1", index=1, count=4, devmem=8192, devcore=0b1111, type="Inf1", vendor="AWSNeuron")
    from hami.core import Ledger
    from hami.vendors.awsneuron import AwsNeuronVendor

    neuron = (AwsNeuronVendor(),)
    led = Ledger(neuron)
    led.set_node(NodeDevices("n", (inf2, inf1)))
    for name, uuid, mask in (("two", "NEURON-n-0", 0b10), ("four", "NEURON-n-1", 0b1000)):
        led.add_pod(
            make_allocation(
                kit.pod(name, ns="team"), "n", {"AWSNeuron": ((ContainerDevice(uuid, "AWSNeuron", 1000, mask),),)}
            )
        )
    text = SchedulerMetrics(lambda: AllocationSnapshot(led, neuron)).render().decode()
    got = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert {s.labels["device_uuid"]: s.value for s in got["hami_gpu_core_allocated_ratio"]} == {
        "NEURON-n-0": 50,
        "NEURON-n-1": 25,
    }
    assert {s.labels["pod"]: s.value for s in got["hami_vgpu_core_allocated_ratio"]} == {"two": 50, "four": 25}
