"""The UI's history: allocation and real use per GPU, pod and namespace over 1 h, 6 h, 24 h and 7 d,
kept in a bounded in-process ring (docs/ui.md "History").

What it owns: :class:`History`, the ring, and :func:`samples`, which turns the two documents the
UI already builds (``/api/v1/nodes`` and ``/api/v1/pods``, live usage joined) into one sample per
series. It does not scrape anything itself (the monitors are read by :mod:`.live`), and it is not
a time-series database: a scheduler restart starts it empty, and a follower replica keeps its own.

Layout. Every series (``gpu`` by UUID, ``pod`` by ``namespace/name``, ``namespace``) holds
:data:`VALUES` per sample, and for each range of :data:`RANGES` a ring of :data:`POINTS` buckets
(1 h in 1-minute buckets, 6 h in 6-minute ones, 24 h in 24-minute ones, 7 d in 168-minute ones);
a bucket keeps the mean of the samples that fell in it. Storage per series is fixed:
``len(RANGES) * POINTS`` x (``len(VALUES)`` float32 + one int32 bucket number + one uint16
count) = 5,280 bytes of arrays; :data:`SERIES_BYTES` (6 KiB) bounds it with the Python objects
around them, and ``tests/unit/test_ui_history.py`` measures it. At most ``max_series`` series
are kept (:data:`MAX_SERIES`, 4096: at most 24 MiB): namespaces are recorded first, then pods
(what tenants see), then GPUs; a series not sampled for 7 days is dropped, and when the ring is full the series
sampled longest ago makes room; a new one that finds no room is counted in ``refused``.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from .model import counted_grants

RANGES = {"1h": 60, "6h": 360, "24h": 1440, "7d": 10080}  # range -> bucket width, seconds
POINTS = 60  # buckets per range
VALUES = ("memoryAllocatedMiB", "coresAllocated", "memoryUsedMiB", "utilizationPercent")
KINDS = ("namespace", "pod", "gpu")  # also the order of recording when the ring is nearly full
MAX_SERIES = 4096
SERIES_BYTES = 6 * 1024  # bytes one series takes at most, arrays and Python objects together
INTERVAL = 60.0  # s between samples: the finest bucket
FORGET = RANGES["7d"] * POINTS  # s without a sample after which a series is dropped
NAN = float("nan")


@dataclass(slots=True)
class Series:
    kind: str
    key: str
    labels: dict[str, str]
    last: float = 0.0  # when it was last sampled
    values: array = field(default_factory=lambda: array("f", [NAN]) * (len(RANGES) * POINTS * len(VALUES)))
    buckets: array = field(default_factory=lambda: array("i", [-1]) * (len(RANGES) * POINTS))
    counts: array = field(default_factory=lambda: array("H", [0]) * (len(RANGES) * POINTS))

    def add(self, now: float, sample: tuple[float, ...]) -> None:
        self.last = now
        nv = len(VALUES)
        for r, width in enumerate(RANGES.values()):
            bucket = int(now // width)
            slot = r * POINTS + bucket % POINTS
            base = slot * nv
            if self.buckets[slot] != bucket:  # a new bucket: this sample is its mean
                self.buckets[slot] = bucket
                self.counts[slot] = 1
                for i, x in enumerate(sample):
                    self.values[base + i] = x
                continue
            n = min(self.counts[slot], 65534)
            self.counts[slot] = n + 1
            for i, x in enumerate(sample):
                old = self.values[base + i]
                if math.isnan(x):
                    continue
                self.values[base + i] = x if math.isnan(old) else old + (x - old) / (n + 1)

    def points(self, range_: str, now: float) -> dict[str, list]:
        """``t`` (each bucket's start, Unix seconds, oldest first) and one list per value, None
        where no sample fell in the bucket."""
        r = list(RANGES).index(range_)
        width = RANGES[range_]
        last = int(now // width)
        nv = len(VALUES)
        out: dict[str, list] = {"t": []}
        for name in VALUES:
            out[name] = []
        for bucket in range(last - POINTS + 1, last + 1):
            slot = r * POINTS + bucket % POINTS
            out["t"].append(bucket * width)
            stored = self.buckets[slot] == bucket
            for i, name in enumerate(VALUES):
                x = self.values[slot * nv + i] if stored else NAN
                out[name].append(None if math.isnan(x) else round(x, 2))
        return out


class History:
    """The ring. :meth:`record` takes one sample per series (from :func:`samples`); :meth:`series`
    reads them back. No clock and no I/O: ``now`` is passed in."""

    def __init__(self, max_series: int = MAX_SERIES) -> None:
        if max_series < 1:
            raise ValueError(f"history: max_series must be at least 1, got {max_series}")
        self.max_series = max_series
        self._series: dict[tuple[str, str], Series] = {}
        self.refused = 0  # new series that found the ring full (since start)
        self.samples = 0

    def __len__(self) -> int:
        return len(self._series)

    def nbytes(self) -> int:
        """Bytes of the sample arrays (the bulk of :data:`SERIES_BYTES`)."""
        return sum(
            s.values.itemsize * len(s.values) + s.buckets.itemsize * len(s.buckets) + s.counts.itemsize * len(s.counts)
            for s in self._series.values()
        )

    def record(self, now: float, batch: Iterable[tuple[str, str, dict[str, str], tuple[float, ...]]]) -> None:
        """One sample per ``(kind, key, labels, values)``, in the order given (namespaces first);
        one per series: two of the same series in one bucket are averaged (:func:`samples` adds
        up what belongs to one series before)."""
        self.samples += 1
        batch = list(batch)
        for key in [k for k, s in self._series.items() if now - s.last > FORGET]:
            del self._series[key]
        # room for new series: those not in this sample, sampled longest ago first (a deleted pod's)
        wanted = {(kind, key) for kind, key, _, _ in batch}
        spare = sorted((s.last, k) for k, s in self._series.items() if k not in wanted)
        spare.reverse()  # pop() takes the oldest
        for kind, key, labels, values in batch:
            ident = (kind, key)
            series = self._series.get(ident)
            if series is None:
                if len(self._series) >= self.max_series:
                    if not spare:
                        self.refused += 1
                        continue
                    del self._series[spare.pop()[1]]
                series = self._series[ident] = Series(kind, key, dict(labels))
            elif series.labels != labels:
                series.labels = dict(labels)
            series.add(now, values)

    def series(self, kind: str) -> Iterator[Series]:
        for (k, _), s in sorted(self._series.items()):
            if k == kind:
                yield s

    def labels(self, kind: str, key: str) -> dict[str, str] | None:
        """The labels last recorded for a series (None: not in the ring)."""
        series = self._series.get((kind, key))
        return None if series is None else series.labels

    def namespaces(self) -> set[str]:
        return {s.labels.get("namespace", "") for s in self._series.values() if s.labels.get("namespace")}


def _num(x: Any) -> float:
    return NAN if x is None else float(x)


def samples(nodes_doc: Mapping[str, Any], pods_doc: Mapping[str, Any]) -> list[tuple[str, str, dict, tuple]]:
    """One sample per namespace, GPU and pod, from the UI's own ``nodes`` and ``pods`` documents:
    memory and cores allocated, memory used and utilisation (percent; a pod: the highest of its
    grants; a namespace: none) where a monitor answered.

    A DRA claim's grants count once, not once per container using it
    (:func:`.model.counted_grants`), and the items of one pod (its claims, each an item of the
    pods document named after the pod) are added up into one sample: :meth:`History.record`
    averages the samples a series gets in one bucket, so two claims of 1000 and 2000 MiB were
    recorded as 1500 (found by review, 1 Dec)."""
    gpus = []
    for node in nodes_doc.get("items", ()):
        for d in node.get("devices", ()):
            usage = d.get("usage") or {}
            labels = {"node": node["name"], "model": d.get("model", ""), "vendor": d.get("vendor", "")}
            labels["coreUnit"] = (d.get("cores") or {}).get("unit", "percent")
            values = (
                _num(d["memoryMiB"]["allocated"]),
                _num(d["cores"]["allocated"]),
                _num(usage.get("memoryUsedMiB")),
                _num(usage.get("utilizationPercent")),
            )
            gpus.append(("gpu", d["uuid"], labels, values))
    pods: dict[str, tuple[dict, list[float]]] = {}  # key -> (labels, [mem, cores, used, util])
    per_ns: dict[str, list[float]] = {}
    for p in pods_doc.get("items", ()):
        grants = counted_grants(p)
        mem = sum(g.get("memoryMiB") or 0 for g in grants)
        cores = sum(g.get("cores") or 0 for g in grants)
        used = [g["usage"]["memoryUsedMiB"] for g in grants if (g.get("usage") or {}).get("memoryUsedMiB") is not None]
        util = [
            g["usage"]["utilizationPercent"]
            for g in grants
            if (g.get("usage") or {}).get("utilizationPercent") is not None
        ]
        ns = p.get("namespace", "")
        key = f"{ns}/{p.get('name') or (p.get('claim') or {}).get('name', '')}"
        pod = pods.setdefault(key, ({"namespace": ns, "node": p.get("node") or ""}, [0.0, 0.0, NAN, NAN]))[1]
        pod[0] += mem
        pod[1] += cores
        if used:
            pod[2] = (0.0 if math.isnan(pod[2]) else pod[2]) + sum(used)
        if util:
            pod[3] = max(util) if math.isnan(pod[3]) else max(pod[3], *util)
        total = per_ns.setdefault(ns, [0.0, 0.0, NAN])
        total[0] += mem
        total[1] += cores
        if used:
            total[2] = (0.0 if math.isnan(total[2]) else total[2]) + sum(used)
    namespaces = [("namespace", ns, {"namespace": ns}, (t[0], t[1], t[2], NAN)) for ns, t in sorted(per_ns.items())]
    pod_samples = [("pod", key, labels, (v[0], v[1], v[2], float(v[3]))) for key, (labels, v) in pods.items()]
    return namespaces + pod_samples + gpus
