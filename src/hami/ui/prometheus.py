"""The UI's history read from Prometheus (``--ui-prometheus-url``, docs/ui.md "History"), in place
of the in-process ring of :mod:`.history` when one is configured.

What it owns: the PromQL of each history value, built from the metric names the product already
exports (:mod:`hami.metricnames`: the scheduler's allocation families and the node monitor's
usage families), and one range query per value (``/api/v1/query_range``, POST, form-encoded) on
the same 60-bucket grid as the ring, so an answer has the same shape whatever its source.

Safety. Every label value put into a query is checked against :data:`SAFE` (the characters of
Kubernetes names and of device UUIDs; no quote, backslash, brace, comma or space) and refused with
``ValueError`` otherwise; the server validates its query parameters earlier and answers 400, so
this is the second fence, never a string pasted in. A tenant's query carries
``namespace=~"a|b"`` built from the namespaces its RBAC allows (each checked the same way), so
Prometheus returns nothing of another namespace.

Bounds: :data:`TIMEOUT` seconds for all the queries of one answer, at most :data:`MAX_BYTES` read
of each answer and :data:`MAX_SERIES` series per query; beyond them :class:`PrometheusError`
(the server then answers from the ring and says why).
"""

from __future__ import annotations

import asyncio
import math
import time
import re
from typing import Any, Callable, Iterable, Mapping

import aiohttp
import orjson

from hami.metricnames import (
    CONTAINER_MEMORY_USED,
    CONTAINER_UTILIZATION,
    GPU_CORES_ALLOCATED,
    GPU_MEMORY_ALLOCATED,
    HOST_MEMORY_USED,
    HOST_UTILIZATION,
    POD_CORES_ALLOCATED,
    POD_MEMORY_ALLOCATED,
)

from . import history as hist

MIB = 1024 * 1024
TIMEOUT = 10.0  # s for the queries of one answer together
MAX_BYTES = 8 * MIB  # of one query's answer
CONCURRENT = 4  # answers querying Prometheus at once (each sends up to five queries)
ANSWER_REUSE_S = 15  # s an answer is given again to the same question (within one grid step)
MAX_SERIES = 10_000  # in one range query's answer
MAX_KEYS = 200_000  # series keys listed by the first, instant, query (a few bytes each)
AVERAGE_FROM = 300  # s: buckets at least this wide are the mean over the bucket (avg_over_time)
SAFE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]{0,251}[A-Za-z0-9])?")
# per kind: the labels that name a series, and the filters (query parameter -> metric label)
KEYS = {"namespace": ("namespace",), "pod": ("namespace", "pod"), "gpu": ("device_uuid",)}
FILTER_LABELS = {"namespace": "namespace", "node": "node", "uuid": "device_uuid", "pod": "pod"}


class PrometheusError(Exception):
    """Prometheus could not answer (unreachable, timeout, an error status, too large an answer)."""


def label_value(value: str) -> str:
    """``value`` as a PromQL string literal, after checking it holds only :data:`SAFE` characters."""
    if not isinstance(value, str) or not SAFE.fullmatch(value):
        raise ValueError(f"not a name or UUID that may go into a Prometheus query: {str(value)[:60]!r}")
    return '"' + value + '"'  # SAFE has no quote, backslash or line break: nothing to escape


def selector(metric: str, matchers: Mapping[str, str | Iterable[str]]) -> str:
    """``metric{label="v", label=~"a|b"}``: a str is an exact match, a collection any of its values
    (each checked, ``.`` escaped so it is no wildcard)."""
    parts = []
    for label, value in sorted(matchers.items()):
        if isinstance(value, str):
            parts.append(f"{label}={label_value(value)}")
            continue
        values = sorted(set(value))
        if not values:
            raise ValueError(f"an empty set of values for label {label}")
        for v in values:
            label_value(v)
        alternatives = "|".join(v.replace(".", "\\\\.") for v in values)
        parts.append(f'{label}=~"{alternatives}"')
    return metric + "{" + ",".join(parts) + "}"


def queries(kind: str, matchers: Mapping[str, str | Iterable[str]], step: int) -> dict[str, str]:
    """The PromQL of each value of :data:`hist.VALUES` for ``kind`` (a value missing: null).

    Replicas and instances are folded with ``max by`` over the labels that name one allocation
    (several scheduler replicas, or two jobs scraping one monitor, count once), then summed."""

    def raw(metric: str, labels: tuple[str, ...] = ()) -> str:
        sel = selector(metric, {k: v for k, v in matchers.items() if k in labels or not labels})
        return f"avg_over_time({sel}[{step}s])" if step >= AVERAGE_FROM else sel

    pod_alloc = ("namespace", "node", "pod", "container_index", "device_uuid")
    pod_used = ("namespace", "pod", "container", "device_uuid")  # the monitor has no node label here
    no_node = ("namespace", "pod", "device_uuid")
    # the core ratio families are a percentage of the GPU (hami.scheduler.metrics.core_percent);
    # each series is given its GPU's registered cores as a label (``device_cores``, which
    # hami_gpu_memory_allocated_bytes carries; one value per GPU, ``topk`` choosing when it changed
    # within the window), kept by the outer aggregation, for :func:`_assemble` to turn the
    # percentage back into the vendor's unit (compute units, AI cores, ...) the ring answers in
    cores_of = (
        f"(topk by (node, device_uuid) (1, max by (node, device_uuid, device_cores) "
        f"({raw(GPU_MEMORY_ALLOCATED, ('node', 'device_uuid'))})) * 0 + 1)"
    )

    def cores(outer: str, by: tuple[str, ...], inner: tuple[str, ...], metric: str) -> str:
        joined = (
            f"max by ({', '.join(inner)}) ({raw(metric)}) * on (node, device_uuid) group_left (device_cores) {cores_of}"
        )
        return f"{outer} by ({', '.join(by + ('device_cores',))}) ({joined})"

    if kind == "namespace":
        return {
            "memoryAllocatedMiB": f"sum by (namespace) (max by ({', '.join(pod_alloc)}) "
            f"({raw(POD_MEMORY_ALLOCATED)})) / {MIB}",
            "coresAllocated": cores("sum", ("namespace",), pod_alloc, POD_CORES_ALLOCATED),
            "memoryUsedMiB": f"sum by (namespace) (max by ({', '.join(pod_used)}) "
            f"({raw(CONTAINER_MEMORY_USED, no_node)})) / {MIB}",
        }
    if kind == "pod":
        return {
            "memoryAllocatedMiB": f"sum by (namespace, pod, node) (max by ({', '.join(pod_alloc)}) "
            f"({raw(POD_MEMORY_ALLOCATED)})) / {MIB}",
            "coresAllocated": cores("sum", ("namespace", "pod", "node"), pod_alloc, POD_CORES_ALLOCATED),
            "memoryUsedMiB": f"sum by (namespace, pod) (max by ({', '.join(pod_used)}) "
            f"({raw(CONTAINER_MEMORY_USED, no_node)})) / {MIB}",
            "utilizationPercent": f"max by (namespace, pod) ({raw(CONTAINER_UTILIZATION, no_node)})",
        }
    if kind == "gpu":
        return {
            "memoryAllocatedMiB": f"max by (device_uuid, node, device_type) ({raw(GPU_MEMORY_ALLOCATED)}) / {MIB}",
            "coresAllocated": cores(
                "max",
                ("device_uuid", "node", "device_type"),
                ("device_uuid", "node", "device_type"),
                GPU_CORES_ALLOCATED,
            ),
            "memoryUsedMiB": f"max by (device_uuid, node) ({raw(HOST_MEMORY_USED)}) / {MIB}",
            "utilizationPercent": f"max by (device_uuid, node) ({raw(HOST_UTILIZATION)})",
        }
    raise ValueError(f"history kind {kind!r}")


def key_query(kind: str, matchers: Mapping[str, str | Iterable[str]], seconds: int, allocated_only: bool) -> str:
    """An instant query for the keys of every series of ``kind`` with a sample in the last
    ``seconds``: those of the allocation families and (unless ``allocated_only``) of the usage
    ones, each reduced to the labels that name a series (a few bytes per series)."""
    by = ", ".join(KEYS[kind])
    sources = {
        "namespace": ((POD_MEMORY_ALLOCATED, ()), (CONTAINER_MEMORY_USED, ("namespace", "pod", "device_uuid"))),
        "pod": ((POD_MEMORY_ALLOCATED, ()), (CONTAINER_MEMORY_USED, ("namespace", "pod", "device_uuid"))),
        "gpu": ((GPU_MEMORY_ALLOCATED, ()), (HOST_MEMORY_USED, ())),
    }[kind]
    if allocated_only:
        sources = sources[:1]
    parts = []
    for metric, labels in sources:
        sel = selector(metric, {k: v for k, v in matchers.items() if not labels or k in labels})
        parts.append(f"group by ({by}) (last_over_time({sel}[{seconds}s]))")
    return " or ".join(parts)


def grid(range_: str, now: float) -> tuple[int, int, int]:
    """(first evaluation time, last, step): the ring's buckets (``t`` = a bucket's start), each
    evaluated at its end, so a bucket holds what was scraped in it."""
    step = hist.RANGES[range_]
    last = int(now // step)
    return (last - hist.POINTS + 2) * step, (last + 1) * step, step


class PrometheusHistory:
    """Reads history series from the Prometheus HTTP API at ``url`` (its base, e.g.
    ``http://prometheus.monitoring:9090`` or one with a path prefix)."""

    def __init__(
        self, url: str, timeout: float = TIMEOUT, max_bytes: int = MAX_BYTES, concurrent: int = CONCURRENT
    ) -> None:
        self.base = url.rstrip("/")
        self.url = self.base + "/api/v1/query_range"
        self.timeout = timeout
        self.max_bytes = max_bytes
        # at most ``concurrent`` answers query Prometheus at once, and an answer already given for
        # the same question and grid step is given again: callers cannot multiply the queries
        self._slots = asyncio.Semaphore(concurrent)
        self._answers: dict[tuple, tuple[list[dict], int]] = {}
        self._asking: dict[tuple, asyncio.Future] = {}

    async def _query(self, session: aiohttp.ClientSession, promql: str, start: int, end: int, step: int) -> list:
        form = {"query": promql, "start": str(start), "end": str(end), "step": str(step)}
        return await self._post(session, self.url, form, "matrix", MAX_SERIES)

    async def _post(self, session: aiohttp.ClientSession, url: str, form: dict, kind: str, most: int) -> list:
        try:
            async with session.post(url, data=form, allow_redirects=False) as resp:
                body = bytearray()
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise PrometheusError(
                            f"an answer larger than {self.max_bytes // MIB} MiB: narrow the query with "
                            "namespace, node, uuid or pod"
                        )
                status = resp.status
        except PrometheusError:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise PrometheusError(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        try:
            doc = orjson.loads(bytes(body))
        except orjson.JSONDecodeError as exc:
            raise PrometheusError(f"HTTP {status}, not JSON") from exc
        if status != 200 or not isinstance(doc, dict) or doc.get("status") != "success":
            error = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusError(f"HTTP {status}: {str(error or 'no error text')[:200]}")
        data = doc.get("data")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or data.get("resultType") != kind:
            raise PrometheusError(f"the answer is not a {kind}")
        if len(result) > most:
            raise PrometheusError(f"more than {most} series: narrow the query with namespace, node or uuid")
        return result

    async def series(
        self,
        kind: str,
        range_: str,
        now: float,
        filters: Mapping[str, str],
        visible: set[str] | None,
        describe: Callable[[str], Mapping[str, str] | None] = lambda key: None,
        limit: int = 100,
    ) -> tuple[list[dict], int]:
        """(every series of ``kind`` over ``range_``, shaped as the ring's items and sorted by key;
        their number). ``filters`` are the validated query parameters; ``visible`` the namespaces
        the caller may see (None: all). Two steps, so that an answer stays small however many
        series match: one instant query lists the series' keys over the range (:func:`key_query`),
        then the range queries ask for the first ``limit`` of them only. Raises :class:`PrometheusError`, or ``ValueError`` on a
        value that is not a safe name (nothing is sent then)."""
        matchers: dict[str, str | Iterable[str]] = {FILTER_LABELS[k]: v for k, v in filters.items()}
        if visible is not None and kind != "gpu":
            if "namespace" in matchers:
                if matchers["namespace"] not in visible:
                    return [], 0
            elif not visible:
                return [], 0
            else:
                matchers["namespace"] = visible
        start, end, step = grid(range_, now)
        allocated_only = "node" in filters and kind == "pod"
        key = (kind, range_, tuple(sorted(filters.items())), None if visible is None else tuple(sorted(visible)), limit)
        key += (end, int(now // ANSWER_REUSE_S))  # the last bucket keeps moving: reused briefly only
        if key in self._answers:
            return self._answers[key]
        task = self._asking.get(key)
        if task is None:  # the first to ask: the others wait for its answer
            task = self._asking[key] = asyncio.ensure_future(
                self._ask(key, kind, matchers, start, end, step, allocated_only, describe, limit)
            )
            task.add_done_callback(lambda _t, key=key: self._asking.pop(key, None))
        return await asyncio.shield(task)

    async def _ask(self, key: tuple, kind: str, matchers: dict, *rest: Any) -> tuple[list[dict], int]:
        began = time.monotonic()
        try:
            await asyncio.wait_for(self._slots.acquire(), self.timeout)
        except asyncio.TimeoutError as exc:
            raise PrometheusError(f"Prometheus is busy with other answers (no slot within {self.timeout:g} s)") from exc
        try:
            left = max(0.1, self.timeout - (time.monotonic() - began))
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=left)) as session:
                got = await asyncio.wait_for(self._series(session, kind, matchers, *rest), left)
        except asyncio.TimeoutError as exc:
            raise PrometheusError(f"no answer within {self.timeout:g} s") from exc
        finally:
            self._slots.release()
        if len(self._answers) >= 64:
            self._answers.clear()
        self._answers[key] = got
        return got

    async def _series(
        self,
        session: aiohttp.ClientSession,
        kind: str,
        matchers: dict[str, str | Iterable[str]],
        start: int,
        end: int,
        step: int,
        allocated_only: bool,
        describe: Callable[[str], Mapping[str, str] | None],
        limit: int,
    ) -> tuple[list[dict], int]:
        form = {"query": key_query(kind, matchers, end - start + step, allocated_only), "time": str(end)}
        names = KEYS[kind]
        keys = set()
        for s in await self._post(session, self.base + "/api/v1/query", form, "vector", MAX_KEYS):
            metric = s.get("metric") if isinstance(s, dict) else None
            if isinstance(metric, dict) and all(
                isinstance(metric.get(n), str) and SAFE.fullmatch(metric[n]) for n in names
            ):
                keys.add(tuple(metric[n] for n in names))
        chosen = sorted(keys)[:limit]
        if not chosen:
            return [], len(keys)
        narrowed = dict(matchers)
        for i, label in enumerate(names):  # only the chosen series are asked for
            if not isinstance(narrowed.get(label), str):
                narrowed[label] = {k[i] for k in chosen}
        exprs = queries(kind, narrowed, step)
        answers = await asyncio.gather(*(self._query(session, e, start, end, step) for e in exprs.values()))
        items, _ = _assemble(kind, dict(zip(exprs, answers)), start, step, allocated_only, describe)
        wanted = {"/".join(k) for k in chosen}
        return [i for i in items if i["key"] in wanted], len(keys)


def _core_scale(metric: Mapping[str, Any]) -> float:
    """What turns a core percentage of a GPU into its vendor's unit: the GPU's registered cores
    (the ``device_cores`` label the cores queries join in) / 100; 1 (percent kept) without one."""
    try:
        cores = float(metric.get("device_cores", ""))
    except (TypeError, ValueError):
        return 1.0
    return cores / 100 if math.isfinite(cores) and cores >= 0 else 1.0


def _assemble(
    kind: str,
    answers: Mapping[str, list],
    start: int,
    step: int,
    allocated_only: bool,
    describe: Callable[[str], Mapping[str, str] | None],
) -> tuple[list[dict], int]:
    names = KEYS[kind]
    found: dict[str, dict] = {}
    for value_name, result in answers.items():
        for s in result:
            metric = s.get("metric") if isinstance(s, dict) else None
            values = s.get("values") if isinstance(s, dict) else None
            if not isinstance(metric, dict) or not isinstance(values, list):
                continue
            if any(not isinstance(metric.get(n), str) or not metric.get(n) for n in names):
                continue
            key = "/".join(metric[n] for n in names)
            item = found.get(key)
            if item is None:
                if allocated_only and value_name not in ("memoryAllocatedMiB", "coresAllocated"):
                    continue  # the monitor's pod series have no node label to filter on
                item = found[key] = {
                    "kind": kind,
                    "key": key,
                    "labels": {},
                    "points": {"t": [start - step + i * step for i in range(hist.POINTS)]}
                    | {n: [None] * hist.POINTS for n in hist.VALUES},
                }
            labels = item["labels"]
            if kind in ("pod", "namespace"):
                labels["namespace"] = metric["namespace"]
            if kind != "namespace" and isinstance(metric.get("node"), str):
                labels.setdefault("node", metric["node"])
            if kind == "gpu" and isinstance(metric.get("device_type"), str):
                labels.setdefault("model", metric["device_type"])
            points = item["points"][value_name]
            scale = _core_scale(metric) if value_name == "coresAllocated" else 1.0
            for pair in values:
                try:
                    i = round((float(pair[0]) - start) / step)
                    x = float(pair[1]) * scale
                except (TypeError, ValueError, IndexError):
                    continue
                if 0 <= i < hist.POINTS and math.isfinite(x):
                    points[i] = round(x, 2) if points[i] is None else round(points[i] + x, 2)
    for item in found.values():
        if kind == "pod":
            item["labels"].setdefault("node", "")
        if kind == "gpu":
            known = describe(item["key"]) or {}
            item["labels"] = {
                "node": item["labels"].get("node", known.get("node", "")),
                "model": item["labels"].get("model", known.get("model", "")),
                "vendor": known.get("vendor", ""),
                "coreUnit": known.get("coreUnit", "percent"),
            }
    items = [found[k] for k in sorted(found)]
    return items, len(items)
