"""CDI (Container Device Interface) for the device plugin: ``--device-list-strategy``.

``envvar`` (default, HAMi's): the container is given ``NVIDIA_VISIBLE_DEVICES=<uuids>`` and the
NVIDIA container runtime does the rest. ``cdi-annotations`` / ``cdi-cri``: the plugin writes a
CDI spec for this node's GPUs (one JSON file in ``--cdi-spec-dir``, default ``/var/run/cdi``) and
answers Allocate with fully qualified CDI device names (``<kind>=<uuid>``) instead of the env
variable: as the annotation ``<prefix><plugin>_<id>`` of the ContainerAllocateResponse
(``cdi-annotations``, read by containerd >= 1.7 / CRI-O) or in its ``cdi_devices`` field
(``cdi-cri``, kubelet >= 1.28 passes them in the CRI request). The runtime applies the spec's
edits (device nodes) itself. Everything else in the response (libvgpu's env and mounts) is
unchanged.

Pure functions; ``write_spec`` is the one with I/O. The spec's shape follows the CDI spec
(``cdiVersion``, ``kind``, ``devices[].name``, ``devices[].containerEdits.deviceNodes[].path``,
top-level ``containerEdits``); tests validate it against a JSON schema written from that spec.
"""

from __future__ import annotations

import json
import os
import re
import uuid as uuidlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from hami.core.names import CDI_KIND

from .allocate import ContainerResponse

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
            raise CdiConfigError(f"--device-list-strategy: expected one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        vendor, _, cls = self.kind.partition("/")
        if not (_VENDOR.match(vendor) and _CLASS.match(cls)):
            raise CdiConfigError(f"--cdi-kind: expected <vendor>/<class> (e.g. {DEFAULT_KIND}), got {self.kind!r}")
        if not _PREFIX.match(self.annotation_prefix):
            raise CdiConfigError(f"--cdi-annotation-prefix: expected a DNS prefix ending in '/' "
                                 f"(e.g. {DEFAULT_PREFIX}), got {self.annotation_prefix!r}")

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
    devices = [{"name": g.uuid, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{g.minor}"}]}}
               for g in sorted(gpus, key=lambda g: g.minor)]
    return {"cdiVersion": CDI_VERSION, "kind": config.kind, "devices": devices,
            "containerEdits": {"deviceNodes": [{"path": p} for p in CONTROL_NODES]}}


def write_spec(document: dict, spec_dir: str | Path) -> Path:
    """Write the spec atomically (a runtime may read the directory at any moment), mode 0644."""
    directory = Path(spec_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / SPEC_FILE
    tmp = directory / f".{SPEC_FILE}.tmp"
    tmp.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return target


def annotation_key(config: CdiConfig, pod_uid: str, container: str) -> str:
    """``<prefix>hami-device-plugin_<id>``: one key per container, stable for the same pod and container."""
    ident = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"hami-cdi:{pod_uid}/{container}").hex[:16]
    return f"{config.annotation_prefix}{PLUGIN_NAME}_{ident}"


def apply(response: ContainerResponse, config: CdiConfig, pod_uid: str, container: str) -> ContainerResponse:
    """Replace ``NVIDIA_VISIBLE_DEVICES`` by CDI device names (no-op for ``envvar``)."""
    if not config.enabled:
        return response
    envs = dict(response.envs)
    uuids = [u for u in envs.pop("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]
    names = tuple(config.device_name(u) for u in uuids)
    if config.strategy == "cdi-annotations":
        return replace(response, envs=envs, annotations={annotation_key(config, pod_uid, container): ",".join(names)})
    return replace(response, envs=envs, cdi_devices=names)
