"""The web UI in a real browser: headless Chromium (Debian's ``chromium``, installed by
scripts/install-browser.sh) driven by Playwright, against `hami scheduler --ui-bind` on the real
control plane (kube-apiserver + kube-scheduler with our extender + kwok nodes).

What a person would check, through the page only: it loads; it shows the right number of GPUs;
a new GPU pod appears with its grant (polled through the page's own auto-refresh); a pending
pod shows its reason; an Ascend node is shown in its units (GiB of NPU memory, AI cores); live
usage read from a node monitor's /metrics is shown, and the page is usable from the keyboard.
Screenshots go to a temporary directory; with ``HAMI_DOCS_IMAGES=1`` (``make docs-images``) they
replace the committed ones in docs/images/, so ``make test`` leaves the work tree as it found it.
The page load time is printed.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from hami_devkit.cluster import DEFAULT_MANAGED_RESOURCES, ExtenderConfig, SchedulerConfig, free_port

from ._hami import ROOT, PluginStandIn, SchedulerProcess, gpu_pod, gpu_uuid, make_gpu_node, pods, wait_pods

CHROMIUM = os.environ.get("HAMI_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
IMAGES = (
    ROOT / "docs" / "images"
    if os.environ.get("HAMI_DOCS_IMAGES") == "1"
    else Path(tempfile.mkdtemp(prefix="hami-ui-shots-"))
)
WAIT_MS = 60_000  # an upper bound for polling the page, not a timing assertion

pytestmark = [pytest.mark.integration, pytest.mark.browser]
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(
        "no chromium: run scripts/install-browser.sh (Debian's chromium package) for the browser tests",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="no playwright: pip install -e '.[test]'")

CW = "Ascend910B3"
DEVICE_CONFIG = f"""
nvidia: {{resourceCountName: nvidia.com/gpu}}
vnpus:
  configs:
  - {{chipName: 910B3, commonWord: {CW}, resourceName: huawei.com/{CW}, resourceMemoryName: huawei.com/{CW}-memory,
     resourceCoreName: huawei.com/{CW}-core, memoryAllocatable: 65536, memoryCapacity: 65536,
     templates: [{{name: vir05_1c_16g, memory: 16384}}, {{name: vir10_3c_32g, memory: 32768}}]}}
"""


class Monitors:
    """Stands in for `hami monitor` on the kwok nodes: /metrics/<node> in the exporter's format."""

    def __init__(self) -> None:
        self.text: dict[str, str] = {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = outer.text.get(self.path.rsplit("/", 1)[-1])
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write((body or "").encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics/{{node}}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, node: str, uuid_: str, used_mib: int, util: float) -> None:
        labels = f'node="{node}",device_index="0",device_uuid="{uuid_}",device_type="NVIDIA-Tesla T4",zone="vGPU"'
        self.text[node] = (
            f"# TYPE hami_host_gpu_memory_used_bytes gauge\n"
            f"hami_host_gpu_memory_used_bytes{{{labels}}} {used_mib << 20}\n"
            f"# TYPE hami_host_gpu_utilization_ratio gauge\n"
            f"hami_host_gpu_utilization_ratio{{{labels}}} {util}\n"
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def monitors():
    m = Monitors()
    yield m
    m.close()


@pytest.fixture(scope="module")
def ui_hami(kube_cluster, monitors, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("ui") / "device-config.yaml"
    cfg.write_text(DEVICE_CONFIG)
    ui_port = free_port()
    proc = SchedulerProcess(
        kube_cluster,
        f"--device-config-file={cfg}",
        f"--ui-bind=127.0.0.1:{ui_port}",
        "--ui-auth=none",  # loopback, as behind kubectl port-forward; sign-in: tests/integration/test_ui_auth.py
        f"--ui-monitor-url={monitors.url}",
    ).start()
    kube_cluster.configure_hami_scheduler(
        SchedulerConfig(
            extender=ExtenderConfig(
                url_prefix=proc.url,
                managed_resources=DEFAULT_MANAGED_RESOURCES + (f"huawei.com/{CW}", f"huawei.com/{CW}-memory"),
            )
        )
    )
    proc.ui_url = f"http://127.0.0.1:{ui_port}/"
    try:
        yield proc
    finally:
        kube_cluster.configure_hami_scheduler(SchedulerConfig())
        proc.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def _page(browser):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return page, errors


def test_the_page_shows_the_cluster_new_pods_pending_reasons_and_ascend_units(
    kube_cluster, kube_namespace, ui_hami, monitors, browser
):
    ns, tag = kube_namespace, uuid.uuid4().hex[:5]
    model = f"NVIDIA-UI-T4-{tag}"
    gpu_nodes = [f"ui-gpu-{tag}-{i}" for i in range(2)]
    npu_node = f"ui-npu-{tag}"
    for name in gpu_nodes:
        make_gpu_node(kube_cluster, name, gpus=4, labels={"ui-test": tag}, model=model)
    npus = [
        {
            "id": f"{npu_node}-npu-{i}",
            "index": i,
            "count": 4,
            "devmem": 65536,
            "devcore": 20,
            "type": CW,
            "health": True,
        }
        for i in range(2)
    ]
    kube_cluster.create_node(
        npu_node, annotations={f"hami.io/node-register-{CW}": json.dumps(npus)}, allocatable={f"huawei.com/{CW}": "2"}
    )
    monitors.set(gpu_nodes[0], gpu_uuid(gpu_nodes[0], 0), 5120, 42.0)
    page, errors = _page(browser)
    try:
        with PluginStandIn(kube_cluster, set(gpu_nodes)) as standin:
            # --- the page loads, and counts the GPUs of the model our nodes registered
            page.goto(ui_hami.ui_url)
            page.wait_for_selector(f'article[data-node="{gpu_nodes[1]}"]', timeout=WAIT_MS)
            timing = page.evaluate("""() => { const n = performance.getEntriesByType('navigation')[0];
                return {dom: n.domContentLoadedEventEnd, load: n.loadEventEnd}; }""")
            first_render = page.evaluate("() => performance.now()")
            print(
                f"\nUI page load against the dev cluster: DOMContentLoaded {timing['dom']:.0f} ms, load "
                f"{timing['load']:.0f} ms, grid rendered by {first_render:.0f} ms"
            )
            page.select_option("#filter-model", model)
            assert page.get_attribute("#gpu-count", "data-count") == "8"
            assert page.locator(f'article[data-node="{gpu_nodes[0]}"] .gpu').count() == 4
            # --- live usage from the node's monitor (hami_host_gpu_memory_used_bytes), and its absence
            # the GPU's row in its node's card (the "All devices" table shows the same GPU again)
            live_row = page.locator(
                f'article[data-node="{gpu_nodes[0]}"] [data-gpu-uuid="{gpu_uuid(gpu_nodes[0], 0)}"]'
            )
            page.select_option("#refresh-seconds", "2")
            live_row.get_by_text("used 5.0 GiB").wait_for(timeout=WAIT_MS)
            assert page.locator(f'article[data-node="{gpu_nodes[0]}"] .badge.ok').inner_text() == "live usage"
            assert page.locator(f'article[data-node="{gpu_nodes[1]}"]').get_by_text("no live usage").count() == 1
            # --- a new GPU pod appears with its grant (the page refreshes itself)
            kube_cluster.api(
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                gpu_pod("ui-train", ns, mem=3000, cores=30, node_selector={"ui-test": tag}),
            )
            grant = page.locator(f'[data-pod="{ns}/ui-train"] [data-grant-uuid]')
            grant.first.wait_for(timeout=WAIT_MS)
            text = grant.first.inner_text()
            assert "main: NVIDIA" in text and model in text and "2.9 GiB" in text and "30%" in text, text
            bound = wait_pods(
                kube_cluster, ns, lambda ps: ps if ps and ps[0]["spec"].get("nodeName") else None, "ui-train bound"
            )
            assert (
                bound[0]["spec"]["nodeName"] in text
                or bound[0]["spec"]["nodeName"] in page.locator(f'[data-pod="{ns}/ui-train"]').inner_text()
            )
            # --- a pod that fits nowhere shows why
            kube_cluster.api(
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                gpu_pod("ui-too-big", ns, mem=40000, node_selector={"ui-test": tag}),
            )
            pending = page.locator(f'[data-pending="{ns}/ui-too-big"]')
            pending.wait_for(timeout=WAIT_MS)
            pending.locator(".reason").get_by_text("CardInsufficientMemory").wait_for(timeout=WAIT_MS)
            pending.locator("summary").click()
            assert "4/4 CardInsufficientMemory" in pending.locator(f'li[data-node="{gpu_nodes[1]}"]').inner_text()
            assert standin.errors == []
            IMAGES.mkdir(parents=True, exist_ok=True)
            page.select_option("#filter-model", "")
            page.screenshot(path=str(IMAGES / "ui-cluster.png"), full_page=True)
            # --- Ascend: NPU memory in GiB, cores in AI cores
            page.select_option("#filter-node", npu_node)
            npu_card = page.locator(f'article[data-node="{npu_node}"]')
            npu_card.wait_for(timeout=WAIT_MS)
            npu_text = npu_card.inner_text()
            assert npu_card.locator(".gpu").count() == 2
            assert "0 MiB / 64.0 GiB" in npu_text and "0 AI cores / 20 AI cores" in npu_text, npu_text
            summary = page.locator(f'#summary-table tr[data-vendor="{CW}"]').inner_text()
            assert "40 AI cores" in summary and "128.0 GiB" in summary, summary
            page.screenshot(path=str(IMAGES / "ui-ascend-node.png"))
            # --- keyboard: the skip link comes first, the filters are reachable and usable
            page.reload()
            page.wait_for_selector(f'article[data-node="{npu_node}"]', timeout=WAIT_MS)
            page.keyboard.press("Tab")
            assert page.evaluate("() => document.activeElement.className") == "skip"
            page.keyboard.press("Tab")
            assert page.evaluate("() => document.activeElement.id") == "filter-namespace"
            page.focus("#filter-model")
            page.keyboard.press("ArrowDown")  # a select changes with the arrow keys
            assert page.eval_on_selector("#filter-model", "e => e.value") != ""
        assert errors == [], errors
        assert len(pods(kube_cluster, ns)) == 2
    finally:
        page.close()
        for name in gpu_nodes + [npu_node]:
            kube_cluster.delete_node(name)


def test_the_page_shows_dra_gpus_and_claims_beside_extender_ones(kube_cluster, kube_namespace, ui_hami, browser):
    """A GPU the DRA driver publishes is a card marked DRA with its claim's share; the claim
    kube-scheduler allocated is a row of the pod table naming the claim and its pod."""
    from hami.node.nvml import PhysicalGPU
    from hami.dra.model import SliceSettings, device_classes, resource_slice, slice_name

    ns, tag = kube_namespace, uuid.uuid4().hex[:5]
    node = f"ui-dra-{tag}"
    resource = "/apis/resource.k8s.io/v1"
    kube_cluster.create_node(node, labels={"ui-dra": tag})
    # what `hami dra` publishes (here with plain POSTs: the browser's loop owns this thread)
    for cls in device_classes():
        kube_cluster.api("POST", f"{resource}/deviceclasses", cls, expect=(201, 409))
    kube_cluster.api(
        "POST",
        f"{resource}/resourceslices",
        resource_slice(
            node,
            [PhysicalGPU(0, f"GPU-ui-dra-{tag}", "Tesla T4", 15360, "0000:01:00.0", 0)],
            SliceSettings(split_count=4),
        ),
    )
    kube_cluster.api(
        "POST",
        f"{resource}/namespaces/{ns}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "share"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.hami.io",
                                "capacity": {"requests": {"memory": "2048Mi", "cores": "20"}},
                            },
                        }
                    ]
                }
            },
        },
    )
    kube_cluster.api(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "dra-user"},
            "spec": {
                "nodeSelector": {"ui-dra": tag},
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "share"}],
                "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            },
        },
    )
    page, errors = _page(browser)
    try:
        page.goto(ui_hami.ui_url)
        page.select_option("#refresh-seconds", "2")
        row = page.locator(f'tr[data-claim="{ns}/share"]')
        row.wait_for(timeout=WAIT_MS)
        page.locator(f'tr[data-claim="{ns}/share"][data-pod="{ns}/dra-user"]').wait_for(timeout=WAIT_MS)
        text = row.inner_text()
        assert "DRA claim share" in text and f"{ns}/dra-user" in text and "main: NVIDIA" in text, text
        assert "2.0 GiB" in text and "20%" in text, text
        card = page.locator(f'article[data-node="{node}"]')
        card.wait_for(timeout=WAIT_MS)
        gpu = card.locator(f'[data-gpu-uuid="GPU-ui-dra-{tag}"]')
        gpu.get_by_text("2.0 GiB / 15.0 GiB").wait_for(timeout=WAIT_MS)
        gpu_text = gpu.inner_text()
        assert "1/4" in gpu_text and "20% / 100%" in gpu_text, gpu_text
        badge = gpu.locator(".badge.dra")
        assert badge.inner_text() == "DRA" and badge.get_attribute("title") == f"DRA claims: {ns}/share"
        page.select_option("#filter-node", node)
        page.screenshot(path=str(IMAGES / "ui-dra.png"))
        assert errors == [], errors
    finally:
        page.close()
        kube_cluster.api("DELETE", f"{resource}/resourceslices/{slice_name(node)}", expect=(200, 404))
        kube_cluster.delete_node(node)
