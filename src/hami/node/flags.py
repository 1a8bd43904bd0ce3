"""The command-line flags node programs share, defined once: each program's ``command.py`` adds
them from here, then its own.

What this module owns: the flags that mean the same thing in ``hami device-plugin`` and
``hami dra`` (this node's name, the kubeconfig, the two settings files, the host layout
(``--hook-path``, ``--lock-dir``, ``--driver-mount``), where NVML and sysfs are), their
environment defaults, and the argument types (:func:`driver_mount_arg`, :func:`bool_flag`).

What it does not own: a program's own flags (the kubelet directories, intervals, strategies),
and what a flag's value does (``hami.node.settings``, ``hami.node.layout``, ``hami.node.nvml``).
``hami monitor`` keeps its own ``--hook-path``: there it names the directory that holds the
regions (``<hook>/vgpu`` here), a HAMi-compatible meaning of its own.
"""

from __future__ import annotations

import argparse
import os

from .layout import DEFAULT_HOOK_PATH, DEFAULT_LOCK_DIR, MountSpec, parse_driver_mount
from .settings import DEFAULT_NODE_CONFIG


def driver_mount_arg(text: str) -> MountSpec:
    """argparse type of ``--driver-mount``."""
    try:
        return parse_driver_mount(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def abs_path_arg(text: str) -> str:
    """argparse type of a host directory the plugin hands to the kubelet: a relative one would
    reach every GPU container's mounts and fail its creation, far from the flag."""
    if not os.path.isabs(text):
        raise argparse.ArgumentTypeError(f"expected an absolute path, got {text!r}")
    return text


def bool_flag(text: str) -> bool:
    """argparse type of a BOOL flag: 1/t/true/yes/on or 0/f/false/no/off (any case; ``t`` and
    ``f`` as Go's strconv.ParseBool, which reads HAMi's plugin's flags and their env)."""
    value = str(text).strip().lower()
    if value in ("1", "t", "true", "yes", "on"):
        return True
    if value in ("0", "f", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_identity(p: argparse.ArgumentParser) -> None:
    """``--node-name`` and ``--kubeconfig``."""
    env = os.environ.get
    p.add_argument("--node-name", default=env("NODE_NAME", ""), help="this node's name (env NODE_NAME)")
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"), help="kubeconfig file; in-cluster config when unset")


def add_settings(p: argparse.ArgumentParser) -> None:
    """``--config-file`` (device-config.yaml) and ``--node-config`` (config.json)."""
    env = os.environ.get
    p.add_argument("--config-file", default=env("CONFIG_FILE"), help="device-config.yaml (env CONFIG_FILE)")
    p.add_argument(
        "--node-config",
        default=DEFAULT_NODE_CONFIG,
        help=f"node config.json (per-node overrides); a missing file is refused, except at {DEFAULT_NODE_CONFIG} "
        "(HAMi's path: logged, the node runs on device-config.yaml's settings)",
    )


def add_layout(p: argparse.ArgumentParser) -> None:
    """``--hook-path``, ``--lock-dir`` and ``--driver-mount`` (:class:`hami.node.layout.HookPaths`)."""
    env = os.environ.get
    p.add_argument(
        "--hook-path",
        default=env("HOOK_PATH", DEFAULT_HOOK_PATH),
        type=abs_path_arg,
        help="libvgpu prefix: <hook>/vgpu/libvgpu.so (env HOOK_PATH)",
    )
    p.add_argument(
        "--lock-dir", default=DEFAULT_LOCK_DIR, type=abs_path_arg, help=f"host directory mounted at {DEFAULT_LOCK_DIR}"
    )
    p.add_argument(
        "--driver-mount",
        action="append",
        default=[],
        type=driver_mount_arg,
        metavar="HOST[:CONTAINER][:ro|rw]",
        help="a host driver directory every GPU container gets (repeatable; read-only unless rw): for "
        "nodes without the NVIDIA container runtime, see docs/device-plugin.md",
    )


def add_nvml(p: argparse.ArgumentParser) -> None:
    """``--sysfs-root`` and ``--nvml-library``."""
    env = os.environ.get
    p.add_argument("--sysfs-root", default="/sys", help="sysfs root used for NUMA lookups")
    p.add_argument(
        "--nvml-library", default=env("HAMI_NVML_LIBRARY"), help="path of libnvidia-ml.so.1 (env HAMI_NVML_LIBRARY)"
    )


def add_node_flags(p: argparse.ArgumentParser) -> None:
    """Every shared flag, in one order."""
    add_identity(p)
    add_settings(p)
    add_layout(p)
    add_nvml(p)
