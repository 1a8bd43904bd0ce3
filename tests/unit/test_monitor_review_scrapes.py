"""Who may call `hami monitor`'s endpoint, and what each call costs.

The endpoint answers anyone who reaches it (NodePort 31992 by default) and every scrape read
every region (a region kept busy by its container costs ~75 ms of CPU to read): a client opening
many connections at once had the monitor read them all once per connection, in threads that
also slow the feedback round. Scrapes that come while a collection runs now share it."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, generate_latest

from hami.monitor import exporter
from hami.monitor.exporter import ContainerGrant, MonitorCollector, PodRef

from . import _regionkit as kit

UID = "0b6f3b4e-1111-4d7e-9a8e-aaaaaaaaaaaa"
BOUND_S = 30.0


def test_scrapes_that_come_during_a_collection_share_it(tmp_path, monkeypatch):
    root = tmp_path / "containers"
    kit.write(
        root / f"{UID}_main" / "r.cache", uuids=("GPU-1",), procs=[kit.Proc(pid=3, hostpid=30, used={0: (0, 0, 5, 5)})]
    )
    pods = {UID: PodRef("team", "web", UID, grants=(ContainerGrant("main", ("GPU-1",), 1),))}
    collector = MonitorCollector("n1", str(root), pods=lambda: pods)
    registry = CollectorRegistry()
    registry.register(collector)

    reads, entered, release = [], threading.Event(), threading.Event()
    real = exporter.read_region

    def held(path):
        reads.append(path)
        if len(reads) == 1:  # the first collection is still reading when the others come
            entered.set()
            release.wait(BOUND_S)
        return real(path)

    monkeypatch.setattr(exporter, "read_region", held)
    out: list[bytes] = []
    threads = [threading.Thread(target=lambda: out.append(generate_latest(registry))) for _ in range(4)]
    threads[0].start()
    assert entered.wait(BOUND_S)
    for t in threads[1:]:
        t.start()

    def joined() -> int:
        flight = getattr(collector, "_flight", None)
        return flight.joined if flight is not None else 0

    # wait until the other three scrapes wait on the first (or, without sharing, read themselves)
    for _ in range(int(BOUND_S * 100)):
        if joined() == 3 or len(reads) == 4:
            break
        threading.Event().wait(0.01)
    release.set()
    for t in threads:
        t.join(BOUND_S)
    assert len(reads) == 1
    assert len(out) == 4 and len(set(out)) == 1 and b'pod="web"' in out[0]
    generate_latest(registry)  # a scrape after it is a collection of its own
    assert len(reads) == 2
