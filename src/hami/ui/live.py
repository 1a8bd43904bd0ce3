"""Live usage from the node monitors (``hami monitor``'s ``/metrics``), joined into the UI's API.

The scheduler scrapes each node's monitor at ``--ui-monitor-url`` (a template:
``http://{node_ip}:9394/metrics``; ``{node}`` is the node name, ``{node_ip}`` its InternalIP)
every ``interval`` seconds, a few nodes at a time, each with a short timeout. A node keeps its
last good reading: it is *live* while younger than ``stale_after`` and *stale* after (the
API says so and how old it is); a failed scrape keeps the old values and records the error.

Metrics read (names of :mod:`hami.metricnames`, exported by :mod:`hami.monitor.exporter`): per device ``hami_host_gpu_memory_used_bytes``
and ``hami_host_gpu_utilization_ratio`` (label ``device_uuid``); per container
``hami_vgpu_memory_used_bytes`` and ``hami_container_device_utilization_ratio`` (labels
``namespace``, ``pod``, ``container``, ``device_uuid``). Everything else is ignored.

Cost on the scheduler. The scheduler's event loop only downloads a page (at most
:data:`MAX_METRICS_BYTES`); one worker thread at a time then decodes it, keeps only the lines of
those four families (a prefix test per line: their samples and their ``# HELP`` / ``# TYPE``
lines) and parses what is left with prometheus_client's parser, which is pure Python (~1 s per
MiB). Before 1 Dec the whole page was parsed on the loop: a 206 KB page held Filter, Bind and the
leases for 68 ms, a 16 MiB one (what anything answering on the monitor's port could send) for
6.85 s. A page whose kept lines exceed :data:`MAX_PARSED_BYTES`, and pages once a pass has parsed
:data:`PASS_PARSE_BYTES`, are not parsed (the node's ``monitor.error`` says why, its last values
stay), and each pass reads the nodes whose reading is oldest first, so no node (nor one that
answers with megabytes of series) holds the others' usage back for long.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from hami.metricnames import (
    CONTAINER_MEMORY_USED as CTR_MEMORY,
    CONTAINER_UTILIZATION as CTR_UTIL,
    HOST_MEMORY_USED as HOST_MEMORY,
    HOST_UTILIZATION as HOST_UTIL,
)

log = logging.getLogger(__name__)
MIB = 1 << 20
MAX_METRICS_BYTES = 4 << 20  # of one page as downloaded (was 16 MiB)
MAX_PARSED_BYTES = 1 << 20  # of one page's kept lines (~7000 series: a node with ~3500 container devices)
PASS_PARSE_BYTES = 16 << 20  # of kept lines parsed in one pass over every node
READ = (HOST_MEMORY, HOST_UTIL, CTR_MEMORY, CTR_UTIL)  # the families read; every other line is dropped
_KEEP = tuple(f"{n}{sep}" for n in READ for sep in ("{", " ")) + tuple(
    f"# {kind} {n} " for n in READ for kind in ("HELP", "TYPE")
)
#: what every line of the exposition format starts with (a comment, or a metric name then its
#: labels or value); a dropped line must match it, so a page that is not Prometheus text is an error
_LINE = re.compile(r"#|[a-zA-Z_:][a-zA-Z0-9_:]*[{ \t]|\s*$")


@dataclass
class Usage:
    memory_mib: int | None = None
    utilization: float | None = None


@dataclass
class NodeReading:
    """The last reading of one node's monitor."""

    scraped_at: float | None = None  # when the last successful scrape finished (None: never)
    stale_after: float = 60.0
    error: str | None = None  # the last scrape's failure, None when it succeeded
    devices: dict[str, Usage] = field(default_factory=dict)  # uuid -> usage
    containers: dict[tuple[str, str, str, str], Usage] = field(default_factory=dict)  # (ns, pod, ctr, uuid)

    def fresh(self, now: float) -> bool:
        return self.scraped_at is not None and self.error is None and now - self.scraped_at <= self.stale_after


def parse_metrics(text: str) -> tuple[dict[str, Usage], dict[tuple[str, str, str, str], Usage]]:
    """Prometheus text -> (per device, per container) usage. Raises ValueError on text that is not
    the exposition format."""
    devices: dict[str, Usage] = {}
    containers: dict[tuple[str, str, str, str], Usage] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if value != value or value in (float("inf"), float("-inf")):
                continue
            if name in (HOST_MEMORY, HOST_UTIL) and labels.get("device_uuid"):
                u = devices.setdefault(labels["device_uuid"], Usage())
            elif name in (CTR_MEMORY, CTR_UTIL) and labels.get("device_uuid"):
                key = (
                    labels.get("namespace", ""),
                    labels.get("pod", ""),
                    labels.get("container", ""),
                    labels["device_uuid"],
                )
                u = containers.setdefault(key, Usage())
            else:
                continue
            if name in (HOST_MEMORY, CTR_MEMORY):
                u.memory_mib = int(value // MIB)
            else:
                u.utilization = round(float(value), 1)
    return devices, containers


def usage_lines(text: str) -> str:
    """The lines of ``text`` that :func:`parse_metrics` reads (:data:`READ`'s samples and their
    ``# HELP`` / ``# TYPE`` lines), in order. Raises ValueError naming the first dropped line
    that is not a line of the exposition format."""
    kept = []
    for number, line in enumerate(text.split("\n"), 1):
        if line.startswith(_KEEP):
            kept.append(line)
        elif not _LINE.match(line):
            raise ValueError(f"line {number} is not Prometheus text: {line[:60]!r}")
    return "\n".join(kept) + "\n" if kept else ""


def read_page(
    body: bytes, most: int = MAX_PARSED_BYTES
) -> tuple[int, dict[str, Usage], dict[tuple[str, str, str, str], Usage]]:
    """A monitor's page -> (bytes parsed, then :func:`parse_metrics` of its :func:`usage_lines`);
    ValueError when those are more than ``most`` bytes (nothing parsed). Run in a worker thread,
    never on the event loop."""
    kept = usage_lines(body.decode("utf-8", errors="replace"))
    if len(kept) > most:
        raise ValueError(f"{len(kept)} bytes of usage series, more than the {most} parsed for one node")
    return (len(kept), *parse_metrics(kept))


def node_ip(node: Mapping[str, Any]) -> str:
    for addr in (node.get("status") or {}).get("addresses") or ():
        if isinstance(addr, Mapping) and addr.get("type") == "InternalIP" and isinstance(addr.get("address"), str):
            return addr["address"]
    return ""


def monitor_url(template: str, name: str, node: Mapping[str, Any]) -> str | None:
    """The node's monitor URL, or None when the template needs an address the node lacks."""
    ip = node_ip(node)
    if "{node_ip}" in template and not ip:
        return None
    host_ip = f"[{ip}]" if ":" in ip else ip
    return template.replace("{node_ip}", host_ip).replace("{node}", name)


async def read_capped(stream: Any, most: int) -> bytes:
    """The whole body, ValueError past ``most`` bytes. One ``read(n)`` returns what has arrived
    so far (one network chunk, ~64 KiB), not n bytes: a busy node's page was cut mid-line."""
    chunks, size = [], 0
    async for chunk in stream.iter_any():
        size += len(chunk)
        if size > most:
            raise ValueError(f"answer larger than {most >> 20} MiB")
        chunks.append(chunk)
    return b"".join(chunks)


class LiveUsage:
    """Scrapes every node with devices; ``readings`` is what the API joins in (read-only there)."""

    def __init__(
        self,
        template: str,
        nodes: Callable[[], Iterable[tuple[str, Mapping[str, Any]]]],
        interval: float = 15.0,
        timeout: float = 3.0,
        concurrency: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.template = template
        self.nodes = nodes
        self.interval = interval
        self.timeout = timeout
        self.concurrency = concurrency
        self.clock = clock
        self.stale_after = max(3 * interval, interval + 2 * timeout)
        self.readings: dict[str, NodeReading] = {}
        self.budget = PASS_PARSE_BYTES  # bytes of usage lines the current pass may still parse
        self._parsing: asyncio.Lock | None = None  # one page parsed at a time (the worker holds the GIL)

    async def scrape_all(self, session: Any) -> None:
        targets = list(self.nodes())
        names = {n for n, _ in targets}
        for gone in set(self.readings) - names:
            del self.readings[gone]
        # the oldest readings first: a node left unparsed by the last pass's budget goes early
        targets.sort(key=lambda t: self._age_key(t[0]))
        self.budget = PASS_PARSE_BYTES
        gate = asyncio.Semaphore(self.concurrency)

        async def one(name: str, node: Mapping[str, Any]) -> None:
            async with gate:
                await self.scrape(session, name, node)

        await asyncio.gather(*(one(n, obj) for n, obj in targets))

    async def scrape(self, session: Any, name: str, node: Mapping[str, Any]) -> None:
        import aiohttp

        reading = self.readings.setdefault(name, NodeReading(stale_after=self.stale_after))
        url = monitor_url(self.template, name, node)
        if url is None:
            reading.error = "the node has no InternalIP address"
            return
        try:
            async with session.get(
                url, timeout=aiohttp.ClientTimeout(total=self.timeout), allow_redirects=False
            ) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                body = await read_capped(resp.content, MAX_METRICS_BYTES)
            devices, containers = await self._parse(body)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            reading.error = f"{type(exc).__name__}: {str(exc)[:200]}" if str(exc) else type(exc).__name__
            log.debug("monitor of node %s not read: %s", name, reading.error)
            return
        reading.devices, reading.containers = devices, containers
        reading.scraped_at, reading.error = self.clock(), None

    def _age_key(self, name: str) -> float:
        reading = self.readings.get(name)
        return float("-inf") if reading is None or reading.scraped_at is None else reading.scraped_at

    async def _parse(self, body: bytes) -> tuple[dict[str, Usage], dict[tuple[str, str, str, str], Usage]]:
        """:func:`read_page` in a worker thread, one page at a time, charged to this pass's budget
        (ValueError once it is spent)."""
        if self._parsing is None:
            self._parsing = asyncio.Lock()
        async with self._parsing:
            if self.budget <= 0:
                raise ValueError(f"not parsed: this pass already parsed {PASS_PARSE_BYTES} bytes of other nodes' pages")
            size, devices, containers = await asyncio.to_thread(read_page, body, MAX_PARSED_BYTES)
            self.budget -= size
            return devices, containers

    async def run(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    await self.scrape_all(session)
                except Exception:  # noqa: BLE001 - the loop must survive one bad pass
                    log.exception("live usage pass failed")
                await asyncio.sleep(self.interval)
