"""Builders for the per-vendor tests: real-looking Node and Pod objects through the real core."""

from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping

from hami.config import DeviceConfig, chart_device_config
from hami.core import SchedulerConfig, admit_pod, rebuild, schedule_pod
from hami.core.schedule import FilterResult
from hami.vendors import build_vendors

NOW = 1_795_000_000.0  # fixed decision time (unix s)


def config(device_config: DeviceConfig | None = None, **kw: Any) -> SchedulerConfig:
    return SchedulerConfig(build_vendors(device_config or chart_device_config()), **kw)


def node(name: str, annotations: Mapping[str, str] | None = None, capacity: Mapping[str, Any] | None = None) -> dict:
    cap = {k: str(v) for k, v in (capacity or {}).items()}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": dict(annotations or {})},
        "status": {"capacity": cap, "allocatable": dict(cap)},
    }


def ctr(name: str = "main", limits: Mapping[str, Any] | None = None, requests: Mapping[str, Any] | None = None) -> dict:
    res: dict[str, Any] = {"limits": dict(limits or {})}
    if requests:
        res["requests"] = dict(requests)
    return {"name": name, "image": "ubuntu:22.04", "resources": res}


def pod(
    name: str, containers: Iterable[dict], annotations: Mapping[str, str] | None = None, ns: str = "default"
) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": dict(annotations or {})},
        "spec": {"schedulerName": "hami-scheduler", "containers": list(containers)},
    }


def admit(p: dict, cfg: SchedulerConfig) -> dict:
    return admit_pod(p, cfg.vendors)[0]


def place(
    nodes: list[dict], pods: list[dict], cfg: SchedulerConfig | None = None, placed: Iterable[dict] = ()
) -> list[FilterResult]:
    """Schedule ``pods`` in order (after admission) on ``nodes``; earlier decisions are reserved."""
    cfg = cfg or config()
    ledger, warnings = rebuild(nodes, list(placed), cfg.vendors)
    assert not warnings, warnings
    return [schedule_pod(admit(copy.deepcopy(p), cfg), None, ledger, cfg, NOW) for p in pods]


def one(nodes: list[dict], p: dict, cfg: SchedulerConfig | None = None) -> FilterResult:
    return place(nodes, [p], cfg)[0]


def on_node(p: dict, node_name: str, annotations: Mapping[str, str]) -> dict:
    """A copy of ``p`` running on ``node_name`` (placed there, as the scheduler records it) and
    carrying ``annotations`` (e.g. an allocation another scheduler or release wrote)."""
    q = copy.deepcopy(p)
    q["metadata"].setdefault("annotations", {}).update({"hami.io/vgpu-node": node_name, **annotations})
    q["spec"]["nodeName"] = node_name
    q["status"] = {"phase": "Running"}
    return q


def running(p: dict, node_name: str, annotations: Mapping[str, str], cfg: SchedulerConfig | None = None) -> dict:
    """:func:`on_node` of ``p`` after admission."""
    return on_node(admit(copy.deepcopy(p), cfg or config()), node_name, annotations)
