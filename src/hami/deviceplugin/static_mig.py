"""Static MIG, ``migStrategy: mixed``: the MIG instances that already exist on the node's GPUs
(made by an administrator, ``nvidia-smi mig`` or mig-parted) advertised as whole devices, one
extended resource per profile: ``nvidia.com/mig-1g.5gb``, ``nvidia.com/mig-3g.20gb``, ... (the
names NVIDIA's device plugin uses). The kubelet hands them out by itself (no scheduler
extender, no sharing): a container asking ``nvidia.com/mig-3g.20gb: 1`` gets one such
instance, its MIG device UUID in ``NVIDIA_VISIBLE_DEVICES``.

What this module owns: finding the instances (:func:`discover_static`), the per-resource
device lists (:class:`StaticMigResource`, shaped like :class:`~.devices.DeviceState` for
:class:`~.server.PluginServer`) and their Allocate (:class:`StaticMigService`). GPUs in MIG
mode are served only here; GPUs not in MIG mode stay shared ``nvidia.com/gpu`` devices.
The layout is read at start-up: restart the plugin after changing it. A critical XID on a GPU
marks its instances unhealthy (the agent's health watcher covers the GPUs in MIG mode too).

Strategies: ``none`` (default) ignores MIG instances, ``mixed`` is this module, ``single``
(every GPU the same profile, advertised as ``nvidia.com/gpu``) is refused at start-up: it
would give ``nvidia.com/gpu`` a second meaning next to hami's shared GPUs.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

import grpc

from hami.node import contract
from hami.node.layout import MountSpec
from hami.node.nvml import MigNvml, mig_enabled
from hami.node.settings import NodeSettings

from .allocate import DeviceSpecs
from .api import HEALTHY, UNHEALTHY, load
from .devices import ChangeFeed

log = logging.getLogger(__name__)
pb, pb_grpc = load()

STRATEGIES = ("none", "single", "mixed")


class StaticMigError(ValueError):
    """Static MIG cannot be served as configured; the message names the key and the value."""


def check_strategy(strategy: str, operating_mode: str) -> None:
    """Refuse what cannot work, at start-up, naming the key."""
    if strategy not in STRATEGIES:
        raise StaticMigError(f"migstrategy: expected one of none, single, mixed, got {strategy!r}")
    if strategy == "single":
        raise StaticMigError(
            "migstrategy 'single' is not supported (it would advertise MIG instances as "
            "nvidia.com/gpu, which hami shares); use 'mixed' (nvidia.com/mig-<profile>)"
        )
    if strategy == "mixed" and operating_mode == "mig":
        raise StaticMigError(
            "migstrategy 'mixed' cannot be combined with operatingmode 'mig' (dynamic MIG makes and "
            "destroys the instances itself); use one of them"
        )


def discover_static(
    uuids: Sequence[str], domain: str = "nvidia.com", parents: dict[str, str] | None = None
) -> dict[str, list[str]]:
    """``resource -> MIG device UUIDs`` over the GPUs in MIG mode (instances with a compute
    instance only; a GPU instance without one is no device yet). A ``+`` in NVML's profile name
    (media extensions, ``1g.10gb+me``) becomes ``.``, as NVIDIA's plugin names the resource: a
    resource name cannot hold ``+``. ``parents``, when given, gets ``MIG device UUID -> its GPU's
    UUID`` (what a health event names)."""
    nvml = MigNvml()
    out: dict[str, list[str]] = {}
    for uuid in uuids:
        if not mig_enabled(uuid):
            continue
        for inst in nvml.instances(uuid):
            if inst.mig_uuid:
                out.setdefault(f"{domain}/mig-{inst.profile.replace('+', '.')}", []).append(inst.mig_uuid)
                if parents is not None:
                    parents[inst.mig_uuid] = uuid
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class _ResourceSettings:
    """The part of NodeSettings PluginServer reads, for one MIG resource."""

    resource_name: str
    enable_preferred_allocation: bool = False

    @property
    def socket_name(self) -> str:
        return f"nvidia-{self.resource_name.rsplit('/', 1)[-1]}.sock"


class StaticMigResource(ChangeFeed):
    """One ``nvidia.com/mig-<profile>`` resource: its MIG devices (a fixed set) and their health.
    A fault on a GPU (its XID, :meth:`mark_unhealthy` with the GPU's UUID) takes every instance
    on it out of the kubelet's healthy devices, as a shared GPU's fault takes out its shares (an
    instance whose GPU is not known, ``parents`` without it, is never marked)."""

    def __init__(self, resource: str, mig_uuids: Sequence[str], parents: Mapping[str, str] | None = None) -> None:
        self.settings = _ResourceSettings(resource)
        self.mig_uuids = tuple(mig_uuids)
        self.parents = {u: (parents or {}).get(u, "") for u in self.mig_uuids}
        self.unhealthy: set[str] = set()
        super().__init__()

    @property
    def gpu_uuids(self) -> list[str]:
        """The GPUs its instances are on (those known)."""
        return sorted({p for p in self.parents.values() if p})

    def kubelet_devices(self) -> list[tuple[str, bool, int | None]]:
        return [(u, u not in self.unhealthy, None) for u in self.mig_uuids]

    async def mark_unhealthy(self, gpu_uuids: Iterable[str]) -> None:
        faulty = set(gpu_uuids)
        new = {u for u, p in self.parents.items() if p and p in faulty} - self.unhealthy
        if not new:
            return
        self.unhealthy |= new
        log.warning(
            "%s: %s unhealthy (a fault on GPU %s)",
            self.settings.resource_name,
            ", ".join(sorted(new)),
            ", ".join(sorted(faulty)),
        )
        await self.changed()


def _devices(resource: StaticMigResource) -> list:
    return [pb.Device(ID=u, health=HEALTHY if ok else UNHEALTHY) for u, ok, _ in resource.kubelet_devices()]


class StaticMigService(pb_grpc.DevicePluginServicer):
    """DevicePlugin service of one MIG resource: the kubelet picks the instances, we pass them on.

    The answer has no libvgpu (no preload, no grant file naming the instances): a pod's own
    ``NVIDIA_VISIBLE_DEVICES=all`` (an ``envFrom``, after this env) is not refused in the
    container, unlike dynamic MIG's (``allocate.build_response``). Review, 1 Dec: left open,
    docs/mig.md ("Static MIG") says why (the kubelet names no pod here to key a region by)."""

    def __init__(
        self,
        resource: StaticMigResource,
        driver_mounts: Sequence[MountSpec] = (),
        device_specs: DeviceSpecs | None = None,
    ) -> None:
        self.resource = resource
        self.driver_mounts = tuple(driver_mounts)
        self.device_specs = device_specs  # --pass-device-specs: each instance's nodes
        self.closing = asyncio.Event()

    async def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    async def ListAndWatch(self, request, context):
        seen = self.resource.version
        yield pb.ListAndWatchResponse(devices=_devices(self.resource))
        while not self.closing.is_set():
            version = await self.resource.wait_change(seen, timeout=1.0)
            if version != seen:
                seen = version
                yield pb.ListAndWatchResponse(devices=_devices(self.resource))

    async def GetPreferredAllocation(self, request, context):
        return pb.PreferredAllocationResponse()

    async def Allocate(self, request, context):
        out = []
        for req in request.container_requests:
            unknown = [i for i in req.devices_ids if i not in self.resource.mig_uuids]
            if unknown:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self.resource.settings.resource_name}: unknown MIG device(s) {unknown}",
                )
            out.append(
                pb.ContainerAllocateResponse(
                    envs=contract.visible_devices(req.devices_ids),
                    mounts=[
                        pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                        for m in self.driver_mounts
                    ],
                    devices=[
                        pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                        for d in (self.device_specs.specs(req.devices_ids) if self.device_specs else ())
                    ],
                )
            )
            log.info("%s: allocated %s", self.resource.settings.resource_name, ", ".join(req.devices_ids))
        return pb.AllocateResponse(container_responses=out)

    async def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()


def resources(found: Mapping[str, Sequence[str]], parents: Mapping[str, str] | None = None) -> list[StaticMigResource]:
    return [StaticMigResource(name, uuids, parents) for name, uuids in found.items()]


def settings_without_mig_gpus(settings: NodeSettings, mig_gpus: Sequence[str]) -> NodeSettings:
    """GPUs in MIG mode are served as MIG resources: keep them out of ``nvidia.com/gpu``."""
    return replace(settings, filter_uuids=settings.filter_uuids | frozenset(mig_gpus))
