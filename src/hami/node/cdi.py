"""CDI (Container Device Interface) specs on the node: the one writer, for both front ends.

What this module owns: writing a CDI spec file (:func:`write_document`, atomic through
:func:`hami.node.files.write_atomic`; a container runtime may read the directory at any moment),
the mount edit of a CDI spec (:func:`mount_edit`), and the device plugin's
``--device-list-strategy`` (below). The DRA agent's per-claim spec is built by
``hami.draplugin.prepare`` and written here; what goes into a container (env, mounts) is the
libvgpu container contract's (:mod:`hami.node.contract`), not this module's.

The device plugin's ``--device-list-strategy``:

``envvar`` (default, HAMi's): the container is given ``NVIDIA_VISIBLE_DEVICES=<uuids>`` and the
NVIDIA container runtime does the rest. ``cdi-annotations`` / ``cdi-cri``: the plugin writes a
CDI spec for this node's GPUs (one JSON file in ``--cdi-spec-dir``, default ``/var/run/cdi``) and
answers Allocate with fully qualified CDI device names (``<kind>=<uuid>``) instead of the env
variable: as the annotation ``<prefix><plugin>_<id>`` of the ContainerAllocateResponse
(``cdi-annotations``, read by containerd >= 1.7 / CRI-O) or in its ``cdi_devices`` field
(``cdi-cri``, kubelet >= 1.28 passes them in the CRI request). The runtime applies the spec's
edits (device nodes) itself. Everything else in the response (libvgpu's env and mounts, the
DeviceSpecs of ``--pass-device-specs``) is unchanged.

Pure functions; ``write_spec`` / ``write_document`` are the ones with I/O. The spec's shape
follows the CDI spec (``cdiVersion``, ``kind``, ``devices[].name``, ``devices[].containerEdits.deviceNodes[].path``,
top-level ``containerEdits``); tests validate it against a JSON schema written from that spec.
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, TypeVar

from hami.core.names import CDI_KIND

from . import contract
from .files import write_atomic
from .layout import MountSpec

R = TypeVar("R")  # a response dataclass with ``envs``, ``annotations`` and ``cdi_devices``

STRATEGIES = ("envvar", "cdi-annotations", "cdi-cri")
CDI_VERSION = "0.5.0"
#: Our own vendor/class: NVIDIA's GPU Operator writes ``nvidia.com/gpu`` and HAMi's fork
#: ``k8s.device-plugin.nvidia.com/gpu``; a kind of our own never collides with either spec file
#: (two files defining the same device make the runtime refuse both: HAMi#1106).
DEFAULT_KIND = CDI_KIND
DEFAULT_PREFIX = "cdi.k8s.io/"
SPEC_FILE = "hami-gpu.json"
#: the NVIDIA driver's control devices every GPU container needs
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
PLUGIN_NAME = "hami-device-plugin"

_VENDOR = re.compile(r"^[a-zA-Z]([a-zA-Z0-9.-]*[a-zA-Z0-9])?$")
_CLASS = re.compile(r"^[a-zA-Z]([a-zA-Z0-9_-]*[a-zA-Z0-9])?$")
_PREFIX = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/$")


class CdiConfigError(ValueError):
    """A bad CDI option (the message names the flag and the value)."""


@dataclass(frozen=True)
class CdiConfig:
    strategy: str = "envvar"
    kind: str = DEFAULT_KIND
    annotation_prefix: str = DEFAULT_PREFIX
    spec_dir: str = "/var/run/cdi"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise CdiConfigError(
                f"--device-list-strategy: expected one of {', '.join(STRATEGIES)}, got {self.strategy!r}"
            )
        vendor, _, cls = self.kind.partition("/")
        if not (_VENDOR.match(vendor) and _CLASS.match(cls)):
            raise CdiConfigError(f"--cdi-kind: expected <vendor>/<class> (e.g. {DEFAULT_KIND}), got {self.kind!r}")
        if not self.spec_dir.startswith("/"):
            # the runtime reads the spec from its own absolute directory: one written relative to
            # the plugin's working directory would name devices no runtime can resolve
            raise CdiConfigError(f"--cdi-spec-dir: expected an absolute directory, got {self.spec_dir!r}")
        if not _PREFIX.match(self.annotation_prefix):
            raise CdiConfigError(
                f"--cdi-annotation-prefix: expected a DNS prefix ending in '/' "
                f"(e.g. {DEFAULT_PREFIX}), got {self.annotation_prefix!r}"
            )

    @property
    def enabled(self) -> bool:
        return self.strategy != "envvar"

    def device_name(self, uuid: str) -> str:
        return f"{self.kind}={uuid}"


@dataclass(frozen=True)
class CdiGpu:
    uuid: str
    minor: int  # /dev/nvidia<minor>


def spec(gpus: Iterable[CdiGpu], config: CdiConfig) -> dict:
    """The CDI spec of this node's GPUs: one device per GPU, named by its UUID."""
    devices = [
        {"name": g.uuid, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{g.minor}"}]}}
        for g in sorted(gpus, key=lambda g: g.minor)
    ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": config.kind,
        "devices": devices,
        "containerEdits": {"deviceNodes": [{"path": p} for p in CONTROL_NODES]},
    }


def write_document(document: dict, path: str | Path) -> Path:
    """Write one CDI spec to ``path`` atomically and durably, mode 0644 (any spec: the device
    plugin's, a DRA claim's). Raises :class:`hami.node.files.WriteError` naming the path."""
    return write_atomic(path, json.dumps(document, indent=2, sort_keys=True) + "\n", 0o644)


def write_spec(document: dict, spec_dir: str | Path) -> Path:
    """Write the device plugin's spec as ``<spec_dir>/hami-gpu.json``."""
    return write_document(document, Path(spec_dir) / SPEC_FILE)


def mount_edit(m: MountSpec) -> dict[str, Any]:
    """A bind mount as a CDI ``containerEdits.mounts`` entry."""
    return {
        "hostPath": m.host_path,
        "containerPath": m.container_path,
        "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
    }


def annotation_key(config: CdiConfig, pod_uid: str, container: str) -> str:
    """``<prefix>hami-device-plugin_<id>``: one key per container, stable for the same pod and container."""
    ident = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"hami-cdi:{pod_uid}/{container}").hex[:16]
    return f"{config.annotation_prefix}{PLUGIN_NAME}_{ident}"


def apply(response: R, config: CdiConfig, pod_uid: str, container: str) -> R:
    """Replace ``NVIDIA_VISIBLE_DEVICES`` by CDI device names (no-op for ``envvar``) in a device
    plugin answer (``hami.deviceplugin.allocate.ContainerResponse``)."""
    if not config.enabled:
        return response
    envs = dict(response.envs)
    uuids = [u for u in envs.pop(contract.VISIBLE_DEVICES, "").split(",") if u]
    names = tuple(config.device_name(u) for u in uuids)
    if config.strategy == "cdi-annotations":
        return replace(response, envs=envs, annotations={annotation_key(config, pod_uid, container): ",".join(names)})
    return replace(response, envs=envs, cdi_devices=names)
