"""The web UI's figures at 1000 nodes x 8 GPUs: ``/api/v1/nodes`` response time, and the page's
load time in headless Chromium.

The scheduler's cache is filled as in bench_scheduler.py (1000 Node objects with registration
annotations, 5000 pods with allocation annotations decided by the core, through the same watch
handlers a live cluster feeds), plus 20 pending pods. The UI listener (:mod:`hami.ui.server`)
runs in-process on loopback; every request goes over TCP with a keep-alive client, as the page's
refresh does. Printed: p50/p99 of ``GET /api/v1/nodes`` (whole answer: 8000 devices), of
``/api/v1/pods`` and ``/api/v1/pending`` (each pending pod runs the filter over the 1000 nodes),
the answer sizes, and the same document built in-process without HTTP (model only).

Then, when Debian's chromium and Playwright are installed (scripts/install-browser.sh), the page
itself: navigation to ``load`` and to the node grid drawn (every device row in the DOM), median
of ``--page-runs`` fresh page loads.

Run: ``.venv/bin/python bench/bench_ui_api.py [--nodes 1000 --pods 5000 --runs 200 --page-runs 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bench_scheduler import node_object, percentile, placed_pods, pod_object  # noqa: E402

from hami.core import SchedulerConfig  # noqa: E402
from hami.vendors import build_vendors  # noqa: E402
from tests.unit import _browser  # noqa: E402 - where Chromium is, the listener on a thread


def cluster(nodes: int, pods: int):
    from hami.scheduler.state import ClusterState

    config = SchedulerConfig(build_vendors())
    state = ClusterState(config)
    node_objs = [node_object(n) for n in range(nodes)]
    state.node_handler.replace(node_objs)
    placed = placed_pods(node_objs, pods, config)
    pending = []
    for i in range(20):  # 100 GiB on one GPU fits nowhere
        p = pod_object(f"pending-{i}", 1, 102400, 10)
        p["status"]["phase"] = "Pending"
        pending.append(p)
    state.pod_handler.replace(placed + pending)
    return state


async def http_figures(state, runs: int) -> tuple[str, int]:
    import aiohttp

    from hami.ui import model
    from hami.ui.server import UiApi, serve_ui

    api = UiApi(state, "hami-scheduler")
    runner = await serve_ui(api, "127.0.0.1", 0)
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for path, n in (
                ("/api/v1/nodes", runs),
                ("/api/v1/pods", max(runs // 4, 10)),
                ("/api/v1/pending", max(runs // 20, 5)),
            ):
                samples, size = [], 0
                for _ in range(n + 3):
                    began = time.perf_counter()
                    async with session.get(base + path) as resp:
                        body = await resp.read()
                        assert resp.status == 200, (path, resp.status)
                    samples.append((time.perf_counter() - began) * 1000)
                    size = len(body)
                samples = samples[3:]  # warm-up
                print(
                    f"  GET {path:<16} p50 {percentile(samples, 50):7.1f} ms  p99 {percentile(samples, 99):7.1f} ms"
                    f"  ({n} calls, answer {size / 1024:.0f} KiB)"
                )
        samples = []
        for _ in range(max(runs // 4, 10)):
            began = time.perf_counter()
            model.nodes_document(state, time.time())
            samples.append((time.perf_counter() - began) * 1000)
        print(
            f"  nodes document in-process (no HTTP, no JSON) p50 {percentile(samples, 50):.1f} ms"
            f"  p99 {percentile(samples, 99):.1f} ms"
        )
    finally:
        await runner.cleanup()
    return base, port


def page_figures(state, runs: int) -> None:
    why = _browser.missing()
    if why:
        print(f"  page: SKIP ({why})")
        return
    from playwright.sync_api import sync_playwright

    from hami.ui.server import UiApi

    devices = sum(len(list(state.ledger.device_usage(n))) for n in state.ledger.node_names())
    loads, drawn, everything = [], [], []
    with _browser.serving(UiApi(state, "hami-scheduler")) as url, sync_playwright() as p:
        browser = _browser.launch(p)
        for _ in range(runs):
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.route("**/*", lambda route: route.continue_())  # no HTTP cache between runs
            began = time.perf_counter()
            page.goto(url)
            page.get_by_text("Updated").wait_for(timeout=120_000)  # all four answers in, page drawn
            drawn.append((time.perf_counter() - began) * 1000)
            loads.append(page.evaluate("() => performance.getEntriesByType('navigation')[0].loadEventEnd"))
            page.evaluate(
                "() => { const t = document.getElementById('auto-refresh'); t.checked = false; "
                "t.dispatchEvent(new Event('change')); }"
            )
            began = time.perf_counter()
            # the click renders synchronously: evaluate returns once every row is in the DOM
            page.evaluate("() => document.getElementById('show-all-nodes').click()")
            page.locator(".gpu").nth(devices - 1).wait_for(state="attached", timeout=300_000)
            everything.append((time.perf_counter() - began) * 1000)
            page.close()
        browser.close()
    print(
        f"  page in headless Chromium: load event p50 {percentile(loads, 50):.0f} ms; page drawn with every "
        f"answer (summary, first 48 node cards, pods, pending) p50 {percentile(drawn, 50):.0f} ms "
        f"(max {max(drawn):.0f} ms); 'Show all' to all {devices} device rows p50 "
        f"{percentile(everything, 50):.0f} ms ({runs} loads)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--page-runs", type=int, default=5)
    args = ap.parse_args()
    began = time.perf_counter()
    state = cluster(args.nodes, args.pods)
    print(
        f"UI API: {args.nodes} nodes x 8 GPUs, {len(state.ledger.pods())} pods placed, 20 pending "
        f"(cache filled in {time.perf_counter() - began:.1f} s)"
    )
    asyncio.run(http_figures(state, args.runs))
    page_figures(state, args.page_runs)


if __name__ == "__main__":
    main()
