"""The DRA node agent's own metrics: prepare and unprepare (counts by result, failures by reason,
latency), what the checkpoint holds (claims, devices), and the sweep of claims the kubelet never
unprepared.

:class:`DriverMetrics` owns one ``CollectorRegistry`` (a fresh one per driver, so tests do not
share counters); :class:`hami.draplugin.plugin.Driver` and :mod:`hami.draplugin.sweep` record into
it, ``hami dra --metrics-bind-address`` serves it through :func:`hami.serve.start` (the limits of
every listener). The names are in :mod:`hami.metricnames`. The gauges are read from the checkpoint
at scrape time, so they cannot drift from what is on disk.
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from hami.metricnames import (
    DRA_PREPARE_ERRORS_TOTAL,
    DRA_PREPARE_SECONDS,
    DRA_PREPARE_TOTAL,
    DRA_PREPARED_CLAIMS,
    DRA_PREPARED_DEVICES,
    DRA_SWEEP_ERRORS_TOTAL,
    DRA_SWEPT_CLAIMS_TOTAL,
    DRA_UNPREPARE_ERRORS_TOTAL,
    DRA_UNPREPARE_SECONDS,
    DRA_UNPREPARE_TOTAL,
)

RESULTS = ("ok", "error")
SWEEP_REASONS = ("deleted", "recreated", "deallocated")
#: why a prepare failed (:func:`hami.draplugin.plugin.error_reason`): the kubelet's claim UID is not
#: one, the API server could not be read, the claim was re-created under another UID, its
#: allocation cannot be prepared here, the checkpoint or a file could not be written, anything else
PREPARE_REASONS = ("invalid_uid", "api", "recreated", "allocation", "checkpoint", "io", "other")
UNPREPARE_REASONS = ("checkpoint", "io", "other")
# a prepare reads the claim from the API server and writes two files with fsync: milliseconds to
# seconds; an unprepare removes files
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class DriverMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.prepare_total = Counter(DRA_PREPARE_TOTAL, "Claims prepared, by result", ["result"], registry=r)
        self.prepare_seconds = Histogram(
            DRA_PREPARE_SECONDS, "Latency of one claim's prepare", buckets=BUCKETS, registry=r
        )
        self.unprepare_total = Counter(
            DRA_UNPREPARE_TOTAL, "Claims unprepared at the kubelet's request, by result", ["result"], registry=r
        )
        self.unprepare_seconds = Histogram(
            DRA_UNPREPARE_SECONDS, "Latency of one claim's unprepare", buckets=BUCKETS, registry=r
        )
        self.swept = Counter(
            DRA_SWEPT_CLAIMS_TOTAL,
            "Prepared claims the sweep unprepared: the API server no longer has them or allocates them here",
            ["reason"],
            registry=r,
        )
        self.sweep_errors = Counter(
            DRA_SWEEP_ERRORS_TOTAL, "Prepared claims the sweep could not check (kept)", registry=r
        )
        self.prepare_errors = Counter(
            DRA_PREPARE_ERRORS_TOTAL, "Claims whose prepare failed, by reason", ["reason"], registry=r
        )
        self.unprepare_errors = Counter(
            DRA_UNPREPARE_ERRORS_TOTAL, "Claims whose unprepare failed, by reason", ["reason"], registry=r
        )
        self.prepared_claims = Gauge(DRA_PREPARED_CLAIMS, "Claims prepared on this node", registry=r)
        self.prepared_devices = Gauge(DRA_PREPARED_DEVICES, "Devices of the claims prepared on this node", registry=r)
        for result in RESULTS:  # present (as 0) before the first call
            self.prepare_total.labels(result)
            self.unprepare_total.labels(result)
        for reason in SWEEP_REASONS:
            self.swept.labels(reason)
        for reason in PREPARE_REASONS:
            self.prepare_errors.labels(reason)
        for reason in UNPREPARE_REASONS:
            self.unprepare_errors.labels(reason)

    def track(self, claims: Callable[[], int], devices: Callable[[], int]) -> None:
        """Read the two gauges from these functions at each scrape (the checkpoint's counts)."""
        self.prepared_claims.set_function(lambda: float(claims()))
        self.prepared_devices.set_function(lambda: float(devices()))

    def observe_prepare(self, seconds: float, ok: bool, reason: str = "other") -> None:
        """One claim's prepare; ``reason`` (one of :data:`PREPARE_REASONS`) when it failed."""
        self.prepare_total.labels("ok" if ok else "error").inc()
        if not ok:
            self.prepare_errors.labels(reason if reason in PREPARE_REASONS else "other").inc()
        self.prepare_seconds.observe(max(seconds, 0.0))

    def observe_unprepare(self, seconds: float, ok: bool, reason: str = "other") -> None:
        self.unprepare_total.labels("ok" if ok else "error").inc()
        if not ok:
            self.unprepare_errors.labels(reason if reason in UNPREPARE_REASONS else "other").inc()
        self.unprepare_seconds.observe(max(seconds, 0.0))

    async def serve(self, host: str, port: int, guard: Any = None) -> Any:
        """Serve the registry (on any path, like prometheus_client's own server) on
        :func:`hami.serve.start`'s listener; returns the ``AppRunner`` (``cleanup()`` it)."""
        from hami import serve

        app = serve.wsgi_application(make_wsgi_app(self.registry))
        return await serve.start(app, host, port, guard=guard, dual_stack=True)
