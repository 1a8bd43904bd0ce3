"""``hami dev cluster up|down|env|status``: the test control plane, for a person at a terminal.

``up`` starts a supervisor process in the background that owns a :class:`KubeCluster` (the
same code the integration tests use) and prints the ``KUBECONFIG`` to use; ``down`` stops it
and everything it started; ``env`` prints shell exports (``eval "$(hami dev cluster env)"``).
State lives in ``<cache>/dev-cluster`` (``$HAMI_CACHE`` or ``~/.cache/hami``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hami.dev.cluster import (
    DEFAULT_MANAGED_RESOURCES,
    ClusterError,
    ExtenderConfig,
    KubeCluster,
    SchedulerConfig,
    cache_dir,
    find_binaries,
)

UP_TIMEOUT_S = 180.0
DOWN_TIMEOUT_S = 30.0


def state_dir() -> Path:
    return cache_dir() / "dev-cluster"


def _state_file() -> Path:
    return state_dir() / "state.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="dev_command", metavar="TOOL", required=True)
    cluster = sub.add_parser("cluster", help="a local Kubernetes control plane with fake (kwok) nodes")
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start the control plane in the background and print KUBECONFIG")
    up.add_argument("--extender-url", help="URL prefix of the scheduler extender for the hami-scheduler "
                    "profile, e.g. http://127.0.0.1:8888 (default: no extender)")
    up.add_argument("--managed-resource", action="append", dest="managed_resources", metavar="NAME",
                    help="a resource the extender manages (repeatable; default: the NVIDIA names)")
    up.add_argument("--http-timeout", default="30s", help="extender httpTimeout (default 30s)")
    up.add_argument("--nodes", type=int, default=1, help="kwok nodes to create (default 1)")
    up.add_argument("--gpus", type=int, default=4, help="GPUs per node (nvidia.com/gpu = gpus x 10)")
    actions.add_parser("down", help="stop the control plane started by `up`")
    actions.add_parser("env", help="print shell exports for the running control plane")
    actions.add_parser("status", help="say whether a control plane is running")
    serve = actions.add_parser("serve", help=argparse.SUPPRESS)
    serve.add_argument("--options", required=True)


def run(args: argparse.Namespace) -> int:
    handlers = {"up": _up, "down": _down, "env": _env, "status": _status, "serve": _serve}
    return handlers[args.action](args)


# -- state --------------------------------------------------------------------------------------


def _read_state() -> dict | None:
    try:
        state = json.loads(_state_file().read_text())
    except (FileNotFoundError, ValueError):
        return None
    return state if _alive(int(state.get("pid", 0))) else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exports(state: dict) -> str:
    kubeconfig, binaries = state["env"]["KUBECONFIG"], state["bin"]
    return f'export KUBECONFIG={shlex.quote(kubeconfig)}\nexport PATH={shlex.quote(binaries)}:"$PATH"'


# -- actions ------------------------------------------------------------------------------------


def _options(args: argparse.Namespace) -> dict:
    return {
        "extender_url": args.extender_url,
        "managed_resources": args.managed_resources or list(DEFAULT_MANAGED_RESOURCES),
        "http_timeout": args.http_timeout,
        "nodes": args.nodes,
        "gpus": args.gpus,
    }


def _up(args: argparse.Namespace) -> int:
    state = _read_state()
    if state:
        print(f"a control plane is already running (pid {state['pid']}); its settings:")
        print(_exports(state))
        return 0
    try:
        find_binaries()
        options = _options(args)
        _scheduler_config(options)  # reject bad options here, not in the background
    except (ClusterError, ValueError) as exc:
        print(f"hami dev cluster up: {exc}", file=sys.stderr)
        return 2
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    _state_file().unlink(missing_ok=True)
    log = directory / "supervisor.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "hami", "dev", "cluster", "serve", "--options", json.dumps(options)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        state = _read_state()
        if state:
            print(state["summary"])
            print(f"KUBECONFIG={state['env']['KUBECONFIG']}")
            print("use it with:  eval \"$(hami dev cluster env)\" && kubectl get nodes")
            print("stop it with: hami dev cluster down")
            return 0
        if process.poll() is not None:
            break
        time.sleep(0.2)
    print(f"hami dev cluster up: the control plane did not start; log {log}:", file=sys.stderr)
    print(log.read_text(errors="replace")[-6000:], file=sys.stderr)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    return 1


def _down(args: argparse.Namespace) -> int:
    state = _read_state()
    if not state:
        print("no control plane is running")
        return 0
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        print(f"the supervisor (pid {pid}) did not stop in {DOWN_TIMEOUT_S:.0f}s; killed it", file=sys.stderr)
        return 1
    print(f"stopped the control plane (pid {pid})")
    return 0


def _env(args: argparse.Namespace) -> int:
    state = _read_state()
    if not state:
        print("no control plane is running; start one with `hami dev cluster up`", file=sys.stderr)
        return 1
    print(_exports(state))
    return 0


def _status(args: argparse.Namespace) -> int:
    state = _read_state()
    print(f"running (pid {state['pid']}), KUBECONFIG={state['env']['KUBECONFIG']}" if state else "not running")
    return 0 if state else 3


# -- the background supervisor ------------------------------------------------------------------


def _scheduler_config(options: dict) -> SchedulerConfig:
    url = options.get("extender_url")
    extender = ExtenderConfig(url_prefix=url, managed_resources=tuple(options["managed_resources"]),
                              http_timeout=options["http_timeout"], tls_insecure=True) if url else None
    return SchedulerConfig(extender=extender)


def _serve(args: argparse.Namespace) -> int:
    options = json.loads(args.options)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    workdir = state_dir() / "run"
    shutil.rmtree(workdir, ignore_errors=True)
    cluster = KubeCluster(workdir=workdir, hami_scheduler=_scheduler_config(options))
    try:
        cluster.start()
        for index in range(options["nodes"]):
            cluster.create_node(f"kwok-node-{index}", gpus=options["gpus"], labels={"gpu": "on"})
        state = {"pid": os.getpid(), "env": cluster.env(), "workdir": str(workdir),
                 "bin": str(cluster.binaries["kube-apiserver"].parent),
                 "summary": cluster.describe_startup()}
        tmp = _state_file().with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(_state_file())
        print(cluster.describe_startup(), flush=True)
        while not stop.wait(1.0):
            dead = [name for name, component in cluster.components.items() if not component.alive()]
            if dead:
                print(f"component(s) exited: {', '.join(dead)}\n{cluster.log_tails()}", flush=True)
                return 1
        return 0
    finally:
        _state_file().unlink(missing_ok=True)
        cluster.stop()
