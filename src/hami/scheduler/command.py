"""``hami scheduler``: the extender + webhook process (flags: :mod:`hami.scheduler.options`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from hami import gcpolicy, malloc
from hami.core.errors import ConfigError

from .options import Options, add_arguments as _add_arguments, options_from_args

log = logging.getLogger("hami.scheduler")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_arguments(parser)


async def main(opts: Options) -> int:
    from hami.kube.client import KubeClient, report_wait
    from hami.serve import CertReloader
    from hami.ui.auth import UI_CONNECTIONS

    from .server import SchedulerService, serve

    kube = await KubeClient.connect(opts.kubeconfig, opts.kube_timeout, opts.kube_connections)
    service = SchedulerService(opts, kube)
    reloader = (
        CertReloader(opts.cert_file, opts.key_file, opts.cert_reload_interval, opts.extender_client_ca)
        if opts.tls
        else None
    )
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set() or sig == signal.SIGINT:
            hurry.set()  # Ctrl-C, or a second signal: no delay
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    runner = metrics_runner = loopback = ui_runner = ui_kube = None
    try:
        service.start_background()
        # /readyz answers 503 until every watch has listed; meanwhile the log says why (the
        # reflectors' own retries go on without a word of the server they wait for)
        service.tasks.append(
            loop.create_task(
                report_wait(
                    kube, lambda: [r.name for r in service.reflectors if not r.synced.is_set()], "first lists", log
                )
            )
        )
        if opts.gc_interval:
            service.tasks.append(loop.create_task(gcpolicy.collect_periodically(opts.gc_interval)))
        if reloader:
            service.tasks.append(loop.create_task(reloader.run()))
        # the --http_bind port (the Service's): /filter and /bind only without --extender-bind,
        # and then for --extender-client-ca's certificates alone when one is given
        runner = await serve(
            service,
            opts.host,
            opts.port,
            reloader.context if reloader else None,
            extender=opts.extender_on_main,
            client_cert=bool(opts.extender_client_ca),
        )
        if opts.extender_port is not None:
            loopback = await serve(service, opts.extender_host, opts.extender_port, None, webhook=False)
            log.info(
                "extender also on http://%s:%d (loopback, /filter and /bind)", opts.extender_host, opts.extender_port
            )
        if opts.metrics_port is not None:
            try:  # scheduling matters more than its metrics: a busy port is reported, not fatal
                metrics_runner = await service.metrics.serve(opts.metrics_host, opts.metrics_port)
                log.info("metrics on http://%s:%d/metrics", opts.metrics_host, opts.metrics_port)
            except OSError as exc:
                log.error(
                    "metrics are NOT served: --metrics-bind-address %s:%d: %s",
                    opts.metrics_host,
                    opts.metrics_port,
                    exc,
                )
        if opts.ui_port is not None:
            # its own connections: a flood of sign-ins must not queue Filter's and Bind's writes
            ui_kube = await KubeClient.connect(opts.kubeconfig, opts.kube_timeout, UI_CONNECTIONS)
            ui_runner = await _serve_ui(service, opts, ui_kube)
        scheme = "https" if reloader else "http"
        served = (
            "/webhook and health only"
            if not opts.extender_on_main
            else "/filter and /bind for client certificates of --extender-client-ca"
            if opts.extender_client_ca
            else "/filter and /bind unauthenticated (loopback)"
        )
        log.info(
            "hami scheduler %s listening on %s://%s:%d, %s (leader election %s)",
            opts.scheduler_name,
            scheme,
            opts.host,
            opts.port,
            served,
            ("campaigning as " if opts.leader_campaign else "on, following ") + service.leader.identity
            if opts.leader_elect
            else "off",
        )
        await stop.wait()
        service.draining = True  # answers from now on close their connections
        # campaigning: the Lease goes to the next replica now, not after the delay below
        await service.hand_over(service.extender.bind_timeout)
        if opts.shutdown_delay and not hurry.is_set():
            # the pod is terminating: the Services drop it, but kube-proxy on each node and the API
            # server's endpoints take a moment to see it; until then calls still arrive here
            log.info("stopping in %gs (--shutdown-delay): serving calls routed here meanwhile", opts.shutdown_delay)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(hurry.wait(), opts.shutdown_delay)
    finally:
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        for r in (ui_runner, loopback, runner):
            if r is not None:
                await r.cleanup()
        # nothing is served any more: a campaigned Lease goes to the next replica now, unless a
        # Binding of this replica may still be written (in flight, or cut unanswered): then it is
        # left to expire, as after a crash (found by review, 1 Dec: it was given up here even
        # after hand_over had kept it, and the next leader placed pods onto that Binding's share)
        await service.leader.release(give_up=not service.extender.binding_may_land())
        await service.stop()
        if ui_kube is not None:
            await ui_kube.close()
        await kube.close()
    return 0


async def _serve_ui(service, opts: Options, kube):
    """The read-only UI listener (--ui-bind) and, with --ui-monitor-url, its live-usage scraper;
    ``kube``: the UI's own API client (token and access reviews, events)."""
    from hami.serve import CertReloader
    from hami.ui.auth import Authorizer, KubeReviews
    from hami.ui.live import LiveUsage
    from hami.ui.prometheus import PrometheusHistory
    from hami.ui.server import KubeEvents, UiApi, serve_ui

    state = service.state
    live = None
    if opts.ui_monitor_url:
        live = LiveUsage(
            opts.ui_monitor_url, lambda: [(n, state.nodes[n]) for n in state.device_node_names() if n in state.nodes]
        )
        service.tasks.append(asyncio.get_running_loop().create_task(live.run()))
    authorizer = Authorizer(KubeReviews(kube, audiences=opts.ui_token_audiences)) if opts.ui_auth == "token" else None
    api = UiApi(
        state,
        opts.scheduler_name,
        live,
        synced=service.synced,
        authorizer=authorizer,
        prefix=opts.ui_path_prefix,
        frame_ancestors=opts.ui_frame_ancestors,
        events=KubeEvents(kube),
        prometheus=PrometheusHistory(opts.ui_prometheus_url) if opts.ui_prometheus_url else None,
    )
    # the history ring: one sample a minute of every GPU, pod and namespace (docs/ui.md "History")
    service.tasks.append(asyncio.get_running_loop().create_task(api.run_history()))
    tls = None
    if opts.ui_cert_file:  # its own reloader: it may be another certificate than the webhook's
        tls = CertReloader(opts.ui_cert_file, opts.ui_key_file, opts.cert_reload_interval)
        service.tasks.append(asyncio.get_running_loop().create_task(tls.run()))
    try:
        runner = await serve_ui(api, opts.ui_host, opts.ui_port, ssl_context=None if tls is None else tls.context)
    except OSError as exc:  # as the metrics: scheduling matters more than the page
        log.error("the web UI is NOT served: --ui-bind %s:%d: %s", opts.ui_host, opts.ui_port, exc)
        return None
    log.info(
        "web UI and /api/v1 on %s://%s:%d%s/ (read-only; %s)",
        "https" if tls else "http",
        opts.ui_host,
        opts.ui_port,
        opts.ui_path_prefix,
        "Kubernetes bearer tokens and RBAC" if authorizer else "NO authentication: --ui-auth=none, loopback",
    )
    return runner


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.debug or args.verbosity >= 5 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        opts = options_from_args(args)
    except ConfigError as exc:
        print(f"hami scheduler: {exc}", file=sys.stderr)
        return 2
    malloc.tune()
    if opts.gc_interval:
        gcpolicy.tune()  # with collect_periodically in main: see hami.gcpolicy
    try:
        with asyncio.Runner(loop_factory=_loop_factory(opts.event_loop)) as runner:
            return runner.run(main(opts))
    except OSError as exc:
        print(f"hami scheduler: {exc}", file=sys.stderr)
        return 1


def _loop_factory(name: str):
    """``--event-loop``: uvloop's (libuv; the transports, TLS and timers in C) or, with
    ``asyncio``, None: the standard library's."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None
