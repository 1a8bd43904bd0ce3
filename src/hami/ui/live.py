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
"""

from __future__ import annotations

import asyncio
import logging
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
MAX_METRICS_BYTES = 16 << 20


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

    async def scrape_all(self, session: Any) -> None:
        targets = list(self.nodes())
        names = {n for n, _ in targets}
        for gone in set(self.readings) - names:
            del self.readings[gone]
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
            devices, containers = parse_metrics(body.decode("utf-8", errors="replace"))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            reading.error = f"{type(exc).__name__}: {str(exc)[:200]}" if str(exc) else type(exc).__name__
            log.debug("monitor of node %s not read: %s", name, reading.error)
            return
        reading.devices, reading.containers = devices, containers
        reading.scraped_at, reading.error = self.clock(), None

    async def run(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    await self.scrape_all(session)
                except Exception:  # noqa: BLE001 - the loop must survive one bad pass
                    log.exception("live usage pass failed")
                await asyncio.sleep(self.interval)
