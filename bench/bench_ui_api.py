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
itself: navigation to ``load`` and to the first useful paint (every answer in and drawn, the
tables paged: 12 node cards and 100 device rows of the 8000), median of ``--page-runs`` fresh
page loads; and the time of each interaction (a page of the device table, a search, a sort, a
node, GPU and pod page opened, back to the overview), measured in the page.

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


# the page's interactions (issue 27 item 3), each timed in the page from the event to the DOM
# updated and laid out (the page draws synchronously; offsetHeight forces the layout)
TIMED = (
    "(() => { const t0 = performance.now(); %s; void document.body.offsetHeight; return performance.now() - t0; })()"
)
ROUTE = (
    "new Promise((done) => { const t0 = performance.now(); window.addEventListener('hashchange', () => "
    "{ void document.body.offsetHeight; done(performance.now() - t0); }, { once: true }); location.hash = %s; })"
)
INTERACTIONS = (
    (
        "redraw the overview (as each refresh)",
        TIMED % "const s = document.getElementById('lang'); s.value = 'en'; s.dispatchEvent(new Event('change'))",
    ),
    (
        "next page of the device table",
        TIMED % "document.querySelector('.pager[data-table=\"gpu-table\"] .page-next').click()",
    ),
    (
        "search the device table (one node)",
        TIMED
        % (
            "const i = document.querySelector('.table-search[data-table=\"gpu-table\"]'); "
            "i.value = document.querySelector('article.node').dataset.node; i.dispatchEvent(new Event('input'))"
        ),
    ),
    (
        "clear the search",
        TIMED
        % (
            "const i = document.querySelector('.table-search[data-table=\"gpu-table\"]'); "
            "i.value = ''; i.dispatchEvent(new Event('input'))"
        ),
    ),
    ("sort the device table by memory", TIMED % "document.querySelector('#gpu-table th:nth-child(4) button').click()"),
    (
        "search the node grid",
        TIMED
        % (
            "const i = document.querySelector('.table-search[data-table=\"node-grid\"]'); "
            "i.value = 'zz-none'; i.dispatchEvent(new Event('input'))"
        ),
    ),
    ("open a node page", ROUTE % "document.querySelector('#gpu-table tbody a').getAttribute('href')"),
    (
        "open a GPU page from it",
        ROUTE % "document.querySelector('#detail-devices tbody a[href^=\"#/gpu/\"]').getAttribute('href')",
    ),
    ("open a pod page", ROUTE % "'#/pod/' + document.querySelector('#pod-table tbody tr').dataset.pod"),
    ("back to the overview", ROUTE % "'#'"),
)


def page_figures(state, runs: int) -> None:
    why = _browser.missing()
    if why:
        print(f"  page: SKIP ({why})")
        return
    from playwright.sync_api import sync_playwright

    from hami.ui.server import UiApi

    devices = sum(len(list(state.ledger.device_usage(n))) for n in state.ledger.node_names())
    loads, drawn, rows = [], [], 0
    acts: dict[str, list[float]] = {name: [] for name, _ in INTERACTIONS}
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
            rows = page.evaluate("() => document.querySelectorAll('.gpu, #gpu-table tbody tr').length")
            for name, script in INTERACTIONS:
                acts[name].append(page.evaluate(script))
            page.close()
        browser.close()
    print(
        f"  page in headless Chromium ({devices} devices, tables paged): load event p50 "
        f"{percentile(loads, 50):.0f} ms; first useful paint (every answer in and drawn: summary, the first "
        f"12 node cards, the first 100 device rows, pods, pending) p50 {percentile(drawn, 50):.0f} ms "
        f"(max {max(drawn):.0f} ms), {rows} device rows in the DOM ({runs} loads)"
    )
    for name, samples in acts.items():
        print(f"    {name:<38} p50 {percentile(samples, 50):6.1f} ms  max {max(samples):6.1f} ms")


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
