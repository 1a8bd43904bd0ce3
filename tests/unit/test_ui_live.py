"""Live usage from the node monitors, the UI's flags, the page and `hami simulate --output html`."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web

from hami.core.errors import ConfigError
from hami.monitor import exporter
from hami.scheduler import options as O
from hami.ui import live, page

NODE = {
    "metadata": {"name": "n1"},
    "status": {"addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "127.0.0.1"}]},
}
METRICS = """# HELP hami_host_gpu_memory_used_bytes x
# TYPE hami_host_gpu_memory_used_bytes gauge
hami_host_gpu_memory_used_bytes{node="n1",device_index="0",device_uuid="GPU-a",device_type="T4",zone="vGPU"} 3221225472
# TYPE hami_host_gpu_utilization_ratio gauge
hami_host_gpu_utilization_ratio{node="n1",device_index="0",device_uuid="GPU-a",device_type="T4",zone="vGPU"} 61
# TYPE hami_vgpu_memory_used_bytes gauge
hami_vgpu_memory_used_bytes{namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="GPU-a",zone="vGPU"} 1073741824
# TYPE hami_container_device_utilization_ratio gauge
hami_container_device_utilization_ratio{namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="GPU-a",zone="vGPU"} 12.34
# TYPE hami_vgpu_memory_limit_bytes gauge
hami_vgpu_memory_limit_bytes{namespace="ns",pod="p",container="c",vdevice_index="0",device_uuid="GPU-a",zone="vGPU"} 9e9
"""


def test_the_metrics_read_are_the_monitors_own_names_and_labels():
    for name in (live.HOST_MEMORY, live.HOST_UTIL):
        assert "device_uuid" in exporter.METRICS[name]
    for name in (live.CTR_MEMORY, live.CTR_UTIL):
        assert {"namespace", "pod", "container", "device_uuid"} <= set(exporter.METRICS[name])


def test_parse_metrics_reads_devices_and_containers():
    devices, containers = live.parse_metrics(METRICS)
    assert devices == {"GPU-a": live.Usage(3072, 61.0)}
    assert containers == {("ns", "p", "c", "GPU-a"): live.Usage(1024, 12.3)}
    with pytest.raises(ValueError):
        live.parse_metrics("this is { not prometheus")


@pytest.mark.parametrize(
    "template, expected",
    [
        ("http://{node_ip}:9394/metrics", "http://127.0.0.1:9394/metrics"),
        ("http://monitor.local/{node}/metrics", "http://monitor.local/n1/metrics"),
    ],
)
def test_monitor_url_substitutes_the_node(template, expected):
    assert live.monitor_url(template, "n1", NODE) == expected


def test_monitor_url_needs_an_address_the_node_has():
    assert live.monitor_url("http://{node_ip}:9394/metrics", "n1", {"metadata": {"name": "n1"}}) is None
    v6 = {"status": {"addresses": [{"type": "InternalIP", "address": "fd00::1"}]}}
    assert live.monitor_url("http://{node_ip}:9394/metrics", "n1", v6) == "http://[fd00::1]:9394/metrics"


async def test_scraping_a_real_monitor_then_losing_it_marks_the_node_stale():
    state = {"up": True}

    async def metrics(request: web.Request) -> web.Response:
        if not state["up"]:
            return web.Response(status=500, text="down")
        return web.Response(text=METRICS, content_type="text/plain")

    app = web.Application()
    app.add_routes([web.get("/metrics/{node}", metrics)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    clock = [1000.0]
    nodes = [("n1", NODE), ("n2", {"metadata": {"name": "n2"}})]
    scraper = live.LiveUsage(
        f"http://127.0.0.1:{port}/metrics/{{node}}", lambda: nodes, interval=10, timeout=2, clock=lambda: clock[0]
    )
    try:
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_all(session)
            r = scraper.readings["n1"]
            assert r.fresh(clock[0]) and r.devices["GPU-a"].memory_mib == 3072 and r.error is None
            state["up"] = False
            clock[0] += 5
            await scraper.scrape_all(session)
            assert r.error == "ValueError: HTTP 500" and not r.fresh(clock[0])
            assert r.devices["GPU-a"].memory_mib == 3072 and r.scraped_at == 1000.0  # the last values stay
            state["up"] = True
            await scraper.scrape_all(session)
            assert r.fresh(clock[0])
            clock[0] += scraper.stale_after + 1  # no scrape for too long: stale
            assert not r.fresh(clock[0])
            nodes.pop()
            await scraper.scrape_all(session)
            assert set(scraper.readings) == {"n1"}  # a node gone from the ledger is forgotten
    finally:
        await runner.cleanup()


async def test_an_unreachable_monitor_is_an_error_not_a_crash():
    scraper = live.LiveUsage("http://127.0.0.1:1/metrics", lambda: [("n1", NODE)], timeout=1)
    async with aiohttp.ClientSession() as session:
        await scraper.scrape_all(session)
    reading = scraper.readings["n1"]
    assert reading.scraped_at is None and reading.error and "ClientConnectorError" in reading.error


def _args(*argv):
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_ui_flags():
    opts = O.options_from_args(_args())
    assert opts.ui_port is None  # off by default
    opts = O.options_from_args(
        _args("--ui-bind", "127.0.0.1:9090", "--ui-monitor-url", "http://{node_ip}:9394/metrics")
    )
    assert (opts.ui_host, opts.ui_port, opts.ui_monitor_url) == ("127.0.0.1", 9090, "http://{node_ip}:9394/metrics")


@pytest.mark.parametrize(
    "argv, text",
    [
        (["--ui-bind", "nohost"], "--ui-bind"),
        (["--ui-bind", "127.0.0.1:8080"], "--ui-bind: '127.0.0.1:8080' is the port of another listener"),
        (["--ui-bind", "0.0.0.0:9395"], "--ui-bind"),  # the metrics port
        (["--ui-monitor-url", "http://{node_ip}:9394/metrics"], "only used with --ui-bind"),
        (["--ui-bind", ":9090", "--ui-monitor-url", "file:///etc/passwd"], "--ui-monitor-url"),
        (["--ui-bind", ":9090", "--ui-monitor-url", "http://{secret}/x"], "--ui-monitor-url"),
    ],
)
def test_bad_ui_flags_are_named(argv, text):
    with pytest.raises(ConfigError, match=re.escape(text)):
        O.options_from_args(_args(*argv))


def test_served_page_links_its_assets_and_the_snapshot_page_inlines_them():
    served = page.served_page()
    assert "<!--HAMI" not in served and 'src="static/app.js"' in served
    evil = "</script><script>alert(1)</script>"
    doc = {
        "title": evil,
        "nodes": {"items": [], "generatedAt": "x"},
        "pods": {"items": []},
        "pending": {"items": []},
        "quotas": {"items": []},
    }
    html = page.snapshot_page(doc)
    assert evil not in html and "src=" not in html and 'href="static' not in html
    embedded = re.search(r'id="hami-snapshot">(.*?)</script>', html, re.S).group(1)
    assert json.loads(embedded)["title"] == evil
    with pytest.raises(ValueError, match="pods"):
        page.snapshot_page({"nodes": {}, "pending": {}, "quotas": {}})


def test_simulate_writes_the_page_for_its_run():
    out = subprocess.run(
        [sys.executable, "-m", "hami", "simulate", "--example", "mixed", "--output", "html"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    snap = json.loads(re.search(r'id="hami-snapshot">(.*?)</script>', out, re.S).group(1))
    assert out.startswith("<!doctype html>") and "http://" not in out and "https://" not in out
    vendors = {d["vendor"] for n in snap["nodes"]["items"] for d in n["devices"]}
    assert {"NVIDIA", "Ascend910B3"} <= vendors
    [pending] = snap["pending"]["items"]
    assert pending["name"] == "dcu-too-big" and "CardInsufficientMemory" in pending["summary"]
    assert all(not p["reserved"] for p in snap["pods"]["items"]) and snap["pods"]["items"]
