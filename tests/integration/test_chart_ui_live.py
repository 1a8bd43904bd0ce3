"""The chart's wiring of the web UI's sources (issue 27, item 2), rendered with `helm template`:

- live usage by default: with ``scheduler.ui.enabled`` and the device plugin's monitor on, the
  scheduler gets ``--ui-monitor-url=http://{node_ip}:<devicePlugin.monitor.metricsPort>/metrics``
  and the monitor's ``metrics`` port a ``hostPort`` of the same number (the monitor is on the pod
  network; the monitor's NodePort Service may route to another node's monitor); a
  ``scheduler.ui.monitorURL`` of one's own replaces both, ``scheduler.ui.liveUsage: false`` or a
  disabled monitor or UI leaves both out;
- on the DRA front end (``dra.enabled``, the device plugin's monitor off or not rendered) the DRA
  monitor (``<release>-dra-monitor``) gets that ``hostPort`` instead, ``dra.monitor.metricsPort``;
  with both monitors on (their nodes may overlap) only the extender's gets one, so no node ever
  has two pods asking for the same ``hostPort``;
- ``scheduler.ui.prometheusURL`` becomes ``--ui-prometheus-url``; a URL with a query fails the render.
The rendered flags go through the scheduler's own parser (``_parsed``)."""

from __future__ import annotations

import pytest

from .test_chart import CHART
from .test_chart_ui_auth import _parsed, _render, _scheduler_args

pytestmark = pytest.mark.integration
UI = ("--set", "scheduler.ui.enabled=true")
#: the DRA front end alone, as docs/dra.md installs it
DRA = ("--set", "frontEnd=dra", "--set", "dra.enabled=true", "--set", "devicePlugin.enabled=false")


def _monitor_ports(docs: dict, name: str = "hami-vgpu-monitor") -> list[dict]:
    ds = docs[("DaemonSet", name)]  # the monitor's own DaemonSet
    ctr = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "vgpu-monitor")
    return ctr["ports"]


def _host_ports(docs: dict) -> dict[str, list[int]]:
    """DaemonSet -> the hostPorts its pods ask for (every container, init containers too), where any."""
    out = {}
    for (kind, name), d in docs.items():
        spec = d["spec"]["template"]["spec"] if kind == "DaemonSet" else {}
        ctrs = spec.get("containers", []) + spec.get("initContainers", [])
        ports = sorted(p["hostPort"] for c in ctrs for p in c.get("ports") or () if p.get("hostPort"))
        if ports:
            out[name] = ports
    return out


def _monitor_flag(docs: dict) -> list[str]:
    return [a for a in _scheduler_args(docs) if a.startswith("--ui-monitor-url")]


def test_live_usage_is_wired_to_each_nodes_monitor_by_default(helm_bin):  # noqa: F811
    docs = _render(helm_bin, *UI)
    assert _parsed(_scheduler_args(docs)).ui_monitor_url == "http://{node_ip}:9394/metrics"
    assert _monitor_ports(docs) == [{"name": "metrics", "containerPort": 9394, "hostPort": 9394}]
    moved = _render(helm_bin, *UI, "--set", "devicePlugin.monitor.metricsPort=9500")
    assert _parsed(_scheduler_args(moved)).ui_monitor_url == "http://{node_ip}:9500/metrics"
    assert _monitor_ports(moved) == [{"name": "metrics", "containerPort": 9500, "hostPort": 9500}]


def test_a_monitor_url_of_ones_own_replaces_the_default_and_its_host_port(helm_bin):  # noqa: F811
    docs = _render(helm_bin, *UI, "--set", "scheduler.ui.monitorURL=http://{node}.gpu.example:8080/metrics")
    assert _parsed(_scheduler_args(docs)).ui_monitor_url == "http://{node}.gpu.example:8080/metrics"
    assert _monitor_ports(docs) == [{"name": "metrics", "containerPort": 9394}]


@pytest.mark.parametrize(
    "args",
    [
        (),  # the UI off
        (*UI, "--set", "devicePlugin.monitor.enabled=false"),
        (*UI, "--set", "scheduler.ui.liveUsage=false"),
    ],
)
def test_no_live_usage_and_no_host_port_without_the_ui_or_the_monitor(helm_bin, args):  # noqa: F811
    docs = _render(helm_bin, *args)
    assert _monitor_flag(docs) == []
    if "devicePlugin.monitor.enabled=false" not in args:
        assert all("hostPort" not in p for p in _monitor_ports(docs))


def test_on_the_dra_front_end_the_dra_monitor_gets_the_host_port(helm_bin):  # noqa: F811
    docs = _render(helm_bin, *UI, *DRA)
    assert ("DaemonSet", "hami-vgpu-monitor") not in docs
    assert _parsed(_scheduler_args(docs)).ui_monitor_url == "http://{node_ip}:9394/metrics"
    assert _monitor_ports(docs, "hami-dra-monitor") == [{"name": "metrics", "containerPort": 9394, "hostPort": 9394}]
    assert _host_ports(docs) == {"hami-dra-monitor": [9394]}
    moved = _render(helm_bin, *UI, *DRA, "--set", "dra.monitor.metricsPort=9500")
    assert _parsed(_scheduler_args(moved)).ui_monitor_url == "http://{node_ip}:9500/metrics"
    assert _monitor_ports(moved, "hami-dra-monitor") == [{"name": "metrics", "containerPort": 9500, "hostPort": 9500}]
    # the device plugin running without its monitor: the DRA monitor is still the one read
    no_dp_monitor = _render(helm_bin, *UI, "--set", "dra.enabled=true", "--set", "devicePlugin.monitor.enabled=false")
    assert _host_ports(no_dp_monitor) == {"hami-dra-monitor": [9394]}
    assert _parsed(_scheduler_args(no_dp_monitor)).ui_monitor_url == "http://{node_ip}:9394/metrics"


@pytest.mark.parametrize("dra_port", [9394, 9500])
def test_with_both_monitors_only_the_extenders_gets_a_host_port(helm_bin, dra_port):  # noqa: F811
    """The default nodes overlap (dra.nodeSelector {} is every node, the device plugin's gpu=on
    nodes among them): two pods asking for one hostPort on a node would leave one Pending."""
    docs = _render(helm_bin, *UI, "--set", "dra.enabled=true", "--set", f"dra.monitor.metricsPort={dra_port}")
    assert _host_ports(docs) == {"hami-vgpu-monitor": [9394]}
    assert _monitor_ports(docs, "hami-dra-monitor") == [{"name": "metrics", "containerPort": dra_port}]
    assert _parsed(_scheduler_args(docs)).ui_monitor_url == "http://{node_ip}:9394/metrics"


@pytest.mark.parametrize(
    "args",
    [
        DRA,  # the UI off
        (*UI, *DRA, "--set", "dra.monitor.enabled=false"),
        (*UI, *DRA, "--set", "scheduler.ui.liveUsage=false"),
        (*UI, *DRA, "--set", "scheduler.ui.monitorURL=http://{node}.gpu.example:8080/metrics"),
    ],
)
def test_no_host_port_on_the_dra_monitor_without_the_ui_its_monitor_or_the_default_url(helm_bin, args):  # noqa: F811
    docs = _render(helm_bin, *args)
    assert _host_ports(docs) == {}
    assert [a for a in _monitor_flag(docs) if ":9394/" in a] == []


def test_prometheus_url_comes_from_values(helm_bin):  # noqa: F811
    assert not [a for a in _scheduler_args(_render(helm_bin, *UI)) if a.startswith("--ui-prometheus-url")]
    docs = _render(helm_bin, *UI, "--set", "scheduler.ui.prometheusURL=http://prometheus.monitoring:9090/prom")
    assert _parsed(_scheduler_args(docs)).ui_prometheus_url == "http://prometheus.monitoring:9090/prom"


@pytest.mark.parametrize("bad", ["http://p:9090/?query=up", "ftp://p/", "http://user:pw@p:9090"])
def test_a_bad_prometheus_url_fails_the_render(helm_bin, bad):  # noqa: F811
    result = helm_bin(
        "template",
        "hami",
        str(CHART),
        "--kube-version",
        "1.33.0",
        *UI,
        "--set",
        f"scheduler.ui.prometheusURL={bad}",
        check=False,
    )
    assert result.returncode != 0 and "scheduler.ui.prometheusURL" in result.stderr
