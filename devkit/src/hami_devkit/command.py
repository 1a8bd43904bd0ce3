"""``hami-dev cluster up|down|env|status``: the test control plane, for a person at a terminal.

``up`` starts a supervisor process in the background that owns a :class:`KubeCluster` (the
same code the integration tests use) and prints the ``KUBECONFIG`` to use; ``down`` stops it
and everything it started; ``env`` prints shell exports (``eval "$(hami-dev cluster env)"``).
State lives in ``<cache>/dev-cluster`` (``$HAMI_CACHE`` or ``~/.cache/hami``).

``up --real-node`` adds one real node (kubelet + containerd + runc, :mod:`hami_devkit.realnode`)
beside the kwok nodes; it needs root and the packages of ``scripts/install-node.sh``, and
``down`` removes it with everything it put on the host.
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

from hami_devkit.cluster import (
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
    up.add_argument(
        "--extender-url",
        help="URL prefix of the scheduler extender for the hami-scheduler "
        "profile, e.g. http://127.0.0.1:8888 (default: no extender)",
    )
    up.add_argument(
        "--managed-resource",
        action="append",
        dest="managed_resources",
        metavar="NAME",
        help="a resource the extender manages (repeatable; default: the NVIDIA names)",
    )
    up.add_argument("--http-timeout", default="30s", help="extender httpTimeout (default 30s)")
    up.add_argument("--nodes", type=int, default=1, help="kwok nodes to create (default 1)")
    up.add_argument("--gpus", type=int, default=4, help="GPUs per node (nvidia.com/gpu = gpus x 10)")
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also start a real node (kubelet + containerd + runc; needs root, see docs/testing.md)",
    )
    up.add_argument(
        "--wait-for-real-node",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --real-node: wait this long for another real node on this machine to stop "
        "(one per machine; default: fail at once)",
    )
    up.add_argument(
        "--image",
        action="append",
        dest="images",
        metavar="ARCHIVE",
        default=[],
        help="an OCI image archive to import into the real node's containerd (repeatable)",
    )
    actions.add_parser("down", help="stop the control plane started by `up`")
    actions.add_parser("env", help="print shell exports for the running control plane")
    actions.add_parser("status", help="say whether a control plane is running")
    # internal (`up` starts it in the background): no help line. argparse before 3.12 prints
    # help=SUPPRESS as "==SUPPRESS==" in the list, so the parser is left out of the list instead
    serve = actions.add_parser("serve")
    serve.add_argument("--options", required=True)
    actions._choices_actions = [a for a in actions._choices_actions if a.dest != "serve"]


def run(args: argparse.Namespace) -> int:
    handlers = {"up": _up, "down": _down, "env": _env, "status": _status, "serve": _serve}
    return handlers[args.action](args)


def main(argv: list[str] | None = None) -> int:
    """The ``hami-dev`` console script and ``python -m hami_devkit``."""
    parser = argparse.ArgumentParser(
        prog="hami-dev", description="developer tools: a local control plane (`hami-dev cluster up|down|env`)"
    )
    add_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:
        return 130


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
        "real_node": args.real_node,
        "real_node_wait": args.wait_for_real_node,
        "images": [str(Path(path).resolve()) for path in args.images],
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
        _check_real_node(options)
    except (ClusterError, ValueError) as exc:
        print(f"hami-dev cluster up: {exc}", file=sys.stderr)
        return 2
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    _state_file().unlink(missing_ok=True)
    log = directory / "supervisor.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "hami_devkit", "cluster", "serve", "--options", json.dumps(options)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + UP_TIMEOUT_S + options["real_node_wait"]
    while time.monotonic() < deadline:
        state = _read_state()
        if state:
            print(state["summary"])
            print(f"KUBECONFIG={state['env']['KUBECONFIG']}")
            print('use it with:  eval "$(hami-dev cluster env)" && kubectl get nodes')
            print("stop it with: hami-dev cluster down")
            return 0
        if process.poll() is not None:
            break
        time.sleep(0.2)
    print(f"hami-dev cluster up: the control plane did not start; log {log}:", file=sys.stderr)
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
        print("no control plane is running; start one with `hami-dev cluster up`", file=sys.stderr)
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
    extender = (
        ExtenderConfig(
            url_prefix=url,
            managed_resources=tuple(options["managed_resources"]),
            http_timeout=options["http_timeout"],
            tls_insecure=True,
        )
        if url
        else None
    )
    return SchedulerConfig(extender=extender)


def _check_real_node(options: dict) -> None:
    """Refuse ``--real-node`` at once when this machine cannot run one (names what is missing)."""
    if options["real_node_wait"] < 0:
        raise ValueError(f"--wait-for-real-node: must be >= 0, got {options['real_node_wait']}")
    if options["images"] and not options["real_node"]:
        raise ValueError("--image: only with --real-node (the kwok nodes run no images)")
    for path in options["images"]:
        if not Path(path).is_file():
            raise ValueError(f"--image: no such archive: {path}")
    if not options["real_node"]:
        return
    from hami_devkit.realnode import RealNodeUnavailable, missing_requirements

    missing = missing_requirements(find_binaries())
    if missing:
        raise RealNodeUnavailable(missing)


def _serve(args: argparse.Namespace) -> int:
    options = json.loads(args.options)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    workdir = state_dir() / "run"
    shutil.rmtree(workdir, ignore_errors=True)
    # with a real node, pods reach the API server at the node's address through kube-proxy; the
    # node then closes that port to other machines (hami_devkit.nodehost.guard_api_server)
    cluster = KubeCluster(
        workdir=workdir,
        hami_scheduler=_scheduler_config(options),
        apiserver_bind_address="0.0.0.0" if options.get("real_node") else "127.0.0.1",
    )
    node = None
    try:
        cluster.start()
        for index in range(options["nodes"]):
            cluster.create_node(f"kwok-node-{index}", gpus=options["gpus"], labels={"gpu": "on"})
        summary = cluster.describe_startup()
        if options.get("real_node"):
            from hami_devkit.realnode import RealNode

            # a temporary work directory (short paths: the kubelet makes unix sockets in it)
            node = RealNode(
                cluster,
                images=[Path(path) for path in options.get("images", [])],
                lock_wait=options.get("real_node_wait", 0.0),
            ).start()
            summary += "\n" + node.describe_startup() + "\n" + _real_node_help(node)
        state = {
            "pid": os.getpid(),
            "env": cluster.env(),
            "workdir": str(workdir),
            "bin": str(cluster.binaries["kube-apiserver"].parent),
            "summary": summary,
        }
        if node is not None:
            state["real_node"] = {
                "name": node.name,
                "containerd_socket": str(node.containerd_socket),
                "kubelet_root": str(node.kubelet_root),
                "logs": str(node.log_path("kubelet").parent),
                "workdir": str(node.workdir),
            }
        tmp = _state_file().with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(_state_file())
        print(summary, flush=True)
        while not stop.wait(1.0):
            components = {**cluster.components, **(node.components if node else {})}
            dead = [name for name, component in components.items() if not component.alive()]
            if dead:
                print(f"component(s) exited: {', '.join(dead)}\n{cluster.log_tails()}", flush=True)
                return 1
        return 0
    finally:
        _state_file().unlink(missing_ok=True)
        if node is not None:
            problems = node.stop()
            if problems:
                print("real node: not cleaned: " + "; ".join(problems), flush=True)
        cluster.stop()


def _real_node_help(node) -> str:
    return (
        f"real node {node.name}: work directory {node.workdir}, containerd socket {node.containerd_socket} "
        f"(ctr --address {node.containerd_socket} -n k8s.io ...), kubelet root {node.kubelet_root}, "
        f"logs {node.log_path('kubelet').parent}"
    )
