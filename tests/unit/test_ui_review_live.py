"""From the UI review: the live-usage scrape reads a monitor's whole page. One ``read(n)`` gave
only what had arrived (one chunk), so a busy node's page (~400 KB: 3000 container series) was cut
mid-line: "could not convert string to float", and the node showed no live usage at all."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from hami.ui import live

NODE = {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}


def _page(containers: int) -> bytes:
    lines = ["# TYPE hami_vgpu_memory_used_bytes gauge"]
    for i in range(containers):
        lines.append(
            f'hami_vgpu_memory_used_bytes{{namespace="ns",pod="p{i}",container="c",vdevice_index="0",'
            f'device_uuid="GPU-a",zone="vGPU"}} {(i + 1) << 20}'
        )
    return ("\n".join(lines) + "\n").encode()


async def _scrape(body: bytes) -> live.NodeReading:
    async def metrics(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        for i in range(0, len(body), 8192):  # as a real exporter's page arrives: in pieces
            await resp.write(body[i : i + 8192])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        scraper = live.LiveUsage(f"http://127.0.0.1:{runner.addresses[0][1]}/metrics", lambda: [("n1", NODE)])
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_all(session)
        return scraper.readings["n1"]
    finally:
        await runner.cleanup()


async def test_a_busy_nodes_page_is_read_whole():
    body = _page(3000)
    assert len(body) > 300_000
    reading = await _scrape(body)
    assert reading.error is None
    assert len(reading.containers) == 3000
    assert reading.containers[("ns", "p2999", "c", "GPU-a")].memory_mib == 3000


async def test_a_page_over_the_cap_is_an_error_not_a_partial_reading(monkeypatch):
    monkeypatch.setattr(live, "MAX_METRICS_BYTES", 100_000)
    reading = await _scrape(_page(3000))
    assert reading.scraped_at is None and reading.containers == {}
    assert (reading.error or "").startswith("ValueError: answer larger than")
