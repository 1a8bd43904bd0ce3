"""The `hami` command: one entry point, one sub-command per component.

Each sub-command lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``. Only the module of the chosen sub-command is imported, so
``hami simulate`` does not pay for gRPC or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": (
        "hami.sim.command",
        "place pods on nodes read from YAML files and report the result (--front-end dra: through the DRA path)",
    ),
    "scheduler": ("hami.scheduler.command", "run the scheduler extender and admission webhook"),
    "explain": (
        "hami.scheduler.explain",
        "explain why a pod is pending, from the live cluster "
        "(a pod with DRA claims: per GPU, what its claims would take and what is short)",
    ),
    "device-plugin": ("hami.deviceplugin.command", "run the kubelet device plugin for NVIDIA GPUs"),
    "dra": ("hami.draplugin.command", "run the DRA driver gpu.hami.io on a node (ResourceSlice + kubelet plugin)"),
    "monitor": ("hami.monitor.command", "export per-container GPU usage as Prometheus metrics"),
    "exec": ("hami.execcmd", "run a command under libvgpu with memory and compute limits"),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hami",
        description="Share GPUs between Kubernetes pods with hard memory limits and compute shares.",
    )
    parser.add_argument("--version", action="version", version=f"hami {__import__('hami').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = _top_parser()
        if not argv:
            parser.print_help()
            return 2
        parser.parse_args(argv)  # prints help/version or an error and exits
        return 2
    name = argv[0]
    module_name, help_text = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"hami: the '{name}' command is not available in this build", file=sys.stderr)
            return 2
        raise
    parser = argparse.ArgumentParser(prog=f"hami {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        line = startup_error(exc, args)
        if line is None:
            raise
        print(f"hami {name}: {line}", file=sys.stderr)
        return 1


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def startup_error(exc: BaseException, args: argparse.Namespace) -> str | None:
    """One line for the failures a command meets before it does any work (a listener's port
    taken, no Kubernetes credentials), or None for anything else, which keeps its traceback.

    Matched by the exception's module, not imported: ``hami simulate`` loads neither aiohttp
    nor the Kubernetes client."""
    for leaf in _leaves(exc):
        module = type(leaf).__module__
        if module == "hami.serve" and type(leaf).__name__ == "ListenError":
            return str(leaf)
        if module.startswith("kubernetes_asyncio.config"):
            kubeconfig = getattr(args, "kubeconfig", None)
            if kubeconfig and os.pathsep not in kubeconfig and not os.path.isfile(kubeconfig):
                # the client reads a missing file as an empty one ("Expected key current-context")
                return f"--kubeconfig: no such file {kubeconfig!r}"
            return (
                f"cannot load Kubernetes credentials: {leaf} (give --kubeconfig, set KUBECONFIG, "
                "or run in a pod with a service account)"
            )
    return None


def klog_verbosity(argv: list[str]) -> list[str]:
    """HAMi's binaries take klog's ``-v=N`` / ``--v=N`` / ``-v N``; ours count ``-v``."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in ("-v", "--v") and not eq and i + 1 < len(argv) and argv[i + 1].isdigit():
            eq, value = "=", argv[i + 1]
            i += 1
        if name in ("-v", "--v") and eq:
            if not value.isdigit():
                raise SystemExit(f"{name}: expected a number, got {value!r}")
            out += ["-v"] * int(value)
        else:
            out.append(argv[i])
        i += 1
    return out


def vgpumonitor_main(argv: list[str] | None = None) -> int:
    """``vGPUmonitor``: HAMi's name for ``hami monitor``, for charts written for HAMi's image.

    Such a chart cannot pass our flags (Koordinator's hami-daemon runs ``vGPUmonitor -v=4``,
    fixed) and its users read HAMi's metric names (``HostGPUMemoryUsage``,
    ``vGPU_device_memory_limit_in_bytes``, ...), so under this name the monitor exports them
    beside ours (``--legacy-metrics``)."""
    args = klog_verbosity(list(sys.argv[1:] if argv is None else argv))
    if "--legacy-metrics" not in args:
        args.append("--legacy-metrics")
    return main(["monitor", *args])


if __name__ == "__main__":
    sys.exit(main())
