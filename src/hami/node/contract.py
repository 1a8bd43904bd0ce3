"""The libvgpu container contract: what a process must be given for libvgpu to enforce a grant.

Every front end hands out GPUs through these functions, one per concern, as NVIDIA's device
plugin builds its Allocate answer: the device plugin's Allocate
(``hami.deviceplugin.allocate.build_response``), the DRA agent's prepare
(``hami.draplugin.prepare.container_edits``) and ``hami exec`` (``hami.execcmd.build_plan``).

* :func:`visible_devices` / :func:`cuda_visible_devices`: which GPUs the process sees;
* :func:`limit_env`: a grant (:class:`Limits`) and the node's knobs (:class:`Options`) as
  libvgpu's variables (memory per device, compute share, region file, priority, policy, ...);
  :func:`device_limits` builds the grant of several devices, each with its own memory and
  compute share; :func:`sealed_env` adds every other variable libvgpu reads
  (:func:`libvgpu_names`), set empty, for an env applied over the container's (a CDI spec's);
* :func:`container_region` / :func:`claim_region`: the shared-region file, as the container
  sees it (``<hook>/vgpu/<name>.cache``, deterministic);
* :func:`container_mounts`: the host driver directories, then ``libvgpu.so``, the region
  directory, the lock directory and ``/etc/ld.so.preload``;
* :func:`preload_wanted`: HAMi's escape hatch (``CUDA_DISABLE_CONTROL`` true as Go's ``ParseBool``
  reads it, in the container's env: no ``/etc/ld.so.preload``); :func:`ld_preload`: the same library for a process started
  outside a container (``LD_PRELOAD``);
* :func:`deferred_grant`: the env of a container whose grant comes later, at its creation, from
  the runtime's NRI hook (``--injection=nri``, docs/nri.md): no GPU, and a marker the hook
  recognises and replaces.

Every environment variable name the product writes for a GPU process is spelled here and only
here (the names libvgpu and HAMi read; reference hami-core.md §3); other modules import them.

Where the front ends differ, it is a named parameter, never a second copy:

* ``preload`` of :func:`container_mounts`: the device plugin passes :func:`preload_wanted` of the
  container's env; the DRA agent passes True (a claim is prepared for every container that
  references it, before any of them runs, so no container's env is known; isolation stays on);
* ``region_dir`` of :func:`container_mounts`: None when the grant has no libvgpu isolation (a
  non-hami-core operating mode, the whole-GPU DRA class): the driver mounts only;
* the DRA agent passes its env through :func:`sealed_env` (a CDI spec's env replaces the
  container's variables of the same names, so every libvgpu variable it names is the claim's);
  the device plugin's Allocate cannot (its env comes before the container's in the runtime's
  list: the webhook's rule and the NRI hook guard it, docs/security.md), nor ``hami exec``
  (the caller's own process);
* ``Limits.cores`` None leaves ``CUDA_DEVICE_SM_LIMIT`` unset (``hami exec`` without
  ``--gpucores``); ``Limits.all_devices_memory`` sets the unindexed
  ``CUDA_DEVICE_MEMORY_LIMIT`` (``hami exec``, which may not know the device list).

Not here: which devices and how much (the scheduler, the claim's allocation, ``hami exec``'s
flags), where the host keeps the files (:mod:`hami.node.layout`), and how the answer is carried
(the kubelet's ``ContainerAllocateResponse``, a CDI spec, ``execve``).
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from hami.core import names
from hami.core.quantity import go_true

from .layout import GRANT_FILE, LIBRARY_NAME, HookPaths, MountSpec

if TYPE_CHECKING:  # only read, never built here: ``hami exec`` needs no settings (nor pydantic)
    from .settings import NodeSettings

# ------------------------------------------------------------------------------- the names
# (spelled in hami.core.names, below every writer: the webhook and the NVIDIA backend write some)

#: the GPUs the NVIDIA container runtime shows the container (UUIDs, or MIG device UUIDs)
VISIBLE_DEVICES = names.ENV_VISIBLE_DEVICES
#: the GPUs CUDA shows a process (``hami exec``, which runs outside a container)
CUDA_VISIBLE_DEVICES = names.ENV_CUDA_VISIBLE_DEVICES
#: memory limit; ``_<i>`` per visible device, unsuffixed for every device
MEMORY_LIMIT = names.ENV_MEMORY_LIMIT
#: compute share in percent; ``_<i>`` per visible device, unsuffixed for every device
SM_LIMIT = names.ENV_SM_LIMIT
#: the shared-region file
SHARED_CACHE = names.ENV_SHARED_CACHE
#: "true" when the node oversubscribes memory (deviceMemoryScaling > 1)
OVERSUBSCRIBE = names.ENV_OVERSUBSCRIBE
LOG_LEVEL = names.ENV_LOG_LEVEL
#: 0 high, 1 low
TASK_PRIORITY = names.ENV_TASK_PRIORITY
#: default / force / disable
CORE_POLICY = names.ENV_CORE_POLICY
#: "true" in a container's env: no /etc/ld.so.preload (HAMi's switch; the webhook gates it)
DISABLE_CONTROL = names.ENV_DISABLE_CONTROL
#: the directory whose regions are this process's peers (priority pauses across them)
PEER_REGIONS = names.ENV_PEER_REGIONS
LD_PRELOAD = names.ENV_LD_PRELOAD
#: (beyond HAMi) ``pending`` in a container whose grant the NRI hook must still give it,
#: ``done`` once given (docs/nri.md)
NRI_INJECTION = names.ENV_NRI_INJECTION
GRANT_DEVICES = names.ENV_GRANT_DEVICES
NRI_PENDING, NRI_DONE = "pending", "done"
#: libvgpu's own tuning and test variables (under ``names.GRANT_ENV_PREFIX``): the memory it
#: counts for a CUDA context, and a stall inside the region lock (tests only)
CONTEXT_SIZE = f"{names.GRANT_ENV_PREFIX}CONTEXT_SIZE"
TEST_STALL = f"{names.GRANT_ENV_PREFIX}TEST_STALL_IN_LOCK_MS"
#: libvgpu's compute-share controller (native/libvgpu/limiter.c, docs/compute-shares.md): its
#: period, the priority's quiet time, the contention hold and the two averaging windows
LIMITER_TUNING = names.ENV_LIMITER_TUNING
#: the devices libvgpu reads a ``_<i>`` variable for: i < ``VGPU_MAX_DEV`` (native/libvgpu/region.h)
LIBVGPU_MAX_DEVICES = 16

#: where the container finds the preload file and the lock directory
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_LOCK_DIR = "/tmp/vgpulock"


# ------------------------------------------------------------------------------- the grant


@dataclass(frozen=True)
class Limits:
    """One grant as libvgpu reads it."""

    memory: tuple[str, ...]  # per visible device, in libvgpu's size grammar ("3000m", bytes)
    cores: int | str | None  # percent, the unindexed share; None: unset
    region: str  # the shared-region file, as the process sees it
    priority: int | str | None = None  # None: unset
    all_devices_memory: str | None = None  # the unindexed limit; None: unset
    device_cores: tuple[int | str, ...] = ()  # percent per visible device (``_<i>``); (): none


@dataclass(frozen=True)
class Options:
    """Node-wide knobs of the environment (``config.json`` / ``device-config.yaml``)."""

    memory_oversubscribe: bool = False  # deviceMemoryScaling > 1
    libcuda_log_level: str = ""
    core_policy: str | None = None  # GPU_CORE_UTILIZATION_POLICY; None: unset


def core_policy(settings: NodeSettings) -> str | None:
    """``disable`` with ``disableCoreLimit``, else ``gpuCorePolicy`` unless it is ``default``."""
    if settings.disable_core_limit:
        return "disable"
    return settings.gpu_core_policy if settings.gpu_core_policy != "default" else None


def options(settings: NodeSettings) -> Options:
    """The knobs the node settings give every grant on this node."""
    return Options(
        memory_oversubscribe=settings.device_memory_scaling > 1,
        libcuda_log_level=settings.libcuda_log_level,
        core_policy=core_policy(settings),
    )


def mib(value: int) -> str:
    """A memory size in MiB in libvgpu's grammar: ``3000m``."""
    return f"{value}m"


def device_limits(
    memory_mib: Sequence[int], cores: Sequence[int], region: str, priority: int | str | None = None
) -> Limits:
    """The grant of several devices, the i-th with ``memory_mib[i]`` and ``cores[i]``, i being
    the device's index as the container sees it. Memory is always per device
    (``CUDA_DEVICE_MEMORY_LIMIT_<i>``). The unindexed ``CUDA_DEVICE_SM_LIMIT`` is the share of
    every device when they are equal, as HAMi writes it (so such a grant keeps HAMi's exact env);
    when the shares differ, ``CUDA_DEVICE_SM_LIMIT_<i>`` gives each device its own and the unindexed
    one is the largest (libvgpu, read from the environment, lets an indexed share only lower the
    unindexed one; HAMi-core takes the indexed one), or 0 (no cap) when a device has no share
    (both read an indexed 0 as the unindexed value). E.g. (3000, 5000) MiB with (30, 60) percent:
    ``_0=3000m _1=5000m``, ``SM_LIMIT=60 SM_LIMIT_0=30 SM_LIMIT_1=60``."""
    if not memory_mib or len(memory_mib) != len(cores):
        raise ValueError(
            f"device_limits: one memory and one core share per device, got {len(memory_mib)} and {len(cores)}"
        )
    return Limits(
        memory=tuple(mib(m) for m in memory_mib),
        cores=0 if 0 in cores else max(cores),
        region=region,
        priority=priority,
        device_cores=tuple(cores) if len(set(cores)) > 1 else (),
    )


# ------------------------------------------------------------------------------- env


def visible_devices(ids: Sequence[str]) -> dict[str, str]:
    return {VISIBLE_DEVICES: ",".join(ids)}


def cuda_visible_devices(ids: Sequence[str]) -> dict[str, str]:
    return {CUDA_VISIBLE_DEVICES: ",".join(ids)}


def limit_env(limits: Limits, opts: Options) -> dict[str, str]:
    """libvgpu's variables for one grant, in one order on every path."""
    env = {f"{MEMORY_LIMIT}_{i}": m for i, m in enumerate(limits.memory)}
    if limits.all_devices_memory is not None:
        env[MEMORY_LIMIT] = limits.all_devices_memory
    if limits.cores is not None:
        env[SM_LIMIT] = str(limits.cores)
    env.update({f"{SM_LIMIT}_{i}": str(c) for i, c in enumerate(limits.device_cores)})
    env[SHARED_CACHE] = limits.region
    if opts.memory_oversubscribe:
        env[OVERSUBSCRIBE] = "true"
    if opts.libcuda_log_level:
        env[LOG_LEVEL] = opts.libcuda_log_level
    if limits.priority is not None:
        env[TASK_PRIORITY] = str(limits.priority)
    if opts.core_policy:
        env[CORE_POLICY] = opts.core_policy
    return env


def libvgpu_names() -> tuple[str, ...]:
    """Every variable libvgpu reads (native/libvgpu: ``vgpu_config_load`` in config.c, limiter.c,
    priority.c) but its log level: the grant's (:data:`hami.core.names.GRANT_ENV` but the NRI
    marker, which libvgpu reads only to refuse every device while it is ``pending``; the per-device limits unindexed and for every index
    libvgpu reads), the priority, the compute policy, its own tuning (``LIBVGPU_*``) and the
    controller's (:data:`LIMITER_TUNING`). libvgpu reads an empty value of each as unset (its
    default). ``LIBCUDA_LOG_LEVEL`` is left out: it changes no limit, and a pod may choose it
    (as on every front end). tests/unit/test_dra_env_sealed.py checks the list against
    libvgpu's source."""
    grant = [n for n in names.GRANT_ENV if n != NRI_INJECTION]
    per_device = [f"{n}_{i}" for n in (MEMORY_LIMIT, SM_LIMIT) for i in range(LIBVGPU_MAX_DEVICES)]
    tuning = [n for n in LIMITER_TUNING if n not in grant]  # in the grant's list too (names.GRANT_ENV)
    return (*grant, *per_device, TASK_PRIORITY, CORE_POLICY, CONTEXT_SIZE, TEST_STALL, *tuning, GRANT_DEVICES)


#: the longest value the grant file copies from a pod's spec (``CUDA_TASK_PRIORITY``,
#: ``GPU_CORE_UTILIZATION_POLICY``: a few characters each when valid); a longer one is refused
SPEC_VALUE_MAX = 256
#: the longest grant file written: far below what libvgpu reads of it (64 KiB less one byte,
#: native/libvgpu/config.c, which refuses a longer file)
GRANT_FILE_MAX = 16384


def _shorten(value: str, keep: int = 32) -> str:
    return value if len(value) <= keep else f"{value[:keep]}..."


def grant_file(env: Mapping[str, str], spec_env: Mapping[str, str], devices: Sequence[str] = ()) -> str:
    """The grant file's text (``NAME=value`` lines): every variable of :func:`libvgpu_names`,
    the grant's value (from ``env``, a :func:`limit_env`), else for ``CUDA_TASK_PRIORITY`` and
    ``GPU_CORE_UTILIZATION_POLICY`` the pod spec's literal value (``spec_env``, which the
    admission rules checked), else empty (libvgpu's default). Mounted read-only at
    ``<hook>/vgpu/hami-grant.env`` (:func:`container_mounts` with ``grant``), it is where libvgpu
    takes its settings from, over the container's environment: a pod's ``envFrom`` (which no
    admission rule reads) or its image's ``ENV`` then changes no limit (docs/security.md).
    ``devices``: the granted GPUs' UUIDs (``HAMI_GRANT_DEVICES``): libvgpu gives no device to a
    process that sees another (a pod's own ``NVIDIA_VISIBLE_DEVICES``); none: no check.

    What the node decides comes first (``HAMI_GRANT_DEVICES``, then the limits), a value taken
    from the pod's spec last, and such a value is refused (ValueError naming it) over
    :data:`SPEC_VALUE_MAX` bytes or with a control character: the file stays far below what
    libvgpu reads of it (review, 1 Dec: a 66,000-byte policy pushed the device list past it)."""
    from_spec = (TASK_PRIORITY, CORE_POLICY)
    order = (GRANT_DEVICES, *(n for n in libvgpu_names() if n not in (GRANT_DEVICES, *from_spec)), *from_spec)
    values = dict.fromkeys(order, "")
    if devices:
        values[GRANT_DEVICES] = ",".join(devices)
    for name in from_spec:
        value = spec_env.get(name)
        if value is None or name in env:
            continue
        size = len(value.encode())
        if size > SPEC_VALUE_MAX:
            raise ValueError(
                f"grant file: the pod spec's {name}={_shorten(value)!r} is {size} bytes, "
                f"longer than the {SPEC_VALUE_MAX} the grant takes"
            )
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ValueError(
                f"grant file: the pod spec's {name}={_shorten(value)!r} holds a line break or other control character"
            )
        values[name] = value
    values.update({k: v for k, v in env.items() if k in values})
    for name, value in values.items():
        if "\n" in value:
            raise ValueError(f"grant file: {name}={value!r} holds a line break")
    text = "".join(f"{k}={v}\n" for k, v in values.items())
    if len(text.encode()) > GRANT_FILE_MAX:
        raise ValueError(f"grant file: {len(text.encode())} bytes, more than {GRANT_FILE_MAX}")
    return text


def sealed_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` (a grant's, :func:`limit_env`) followed by every other variable of
    :func:`libvgpu_names` set empty, which libvgpu reads as unset: an env applied by name over a
    container's whole env (a CDI spec's) then leaves none of libvgpu's settings to the pod's
    env, ``envFrom`` or image (``CUDA_DEVICE_SM_LIMIT_0=100`` over a grant's unindexed share).
    Only the DRA agent's prepare calls it; the device plugin's Allocate and ``hami exec`` give
    :func:`limit_env` as it is."""
    return {**env, **{n: "" for n in libvgpu_names() if n not in env}}


# ------------------------------------------------------------------------------- the region


def container_region(paths: HookPaths, pod_uid: str, container: str) -> str:
    """A device-plugin container's region file (one per container, the same on every retry)."""
    return f"{paths.vgpu_dir}/{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'hami:{pod_uid}/{container}')}.cache"


def claim_region(paths: HookPaths, claim_uid: str) -> str:
    """A DRA claim's region file (one per claim, shared by its containers)."""
    return f"{paths.vgpu_dir}/{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'hami-dra:{claim_uid}')}.cache"


# ------------------------------------------------------------------------------- mounts and preload


def preload_wanted(env: Mapping[str, str]) -> bool:
    """False when the container sets ``CUDA_DISABLE_CONTROL`` to a value Go's ``ParseBool`` reads
    as true (``1``, ``t``, ``T``, ``true``, ``True``, ``TRUE``), as HAMi's device plugin decides."""
    return not go_true(env.get(DISABLE_CONTROL))


def container_mounts(
    paths: HookPaths, region_dir: str | None, *, preload: bool = True, grant: bool = False
) -> tuple[MountSpec, ...]:
    """The driver directories first, then, with a ``region_dir`` (the host directory shown at
    ``<hook>/vgpu``), libvgpu's: the library, the region directory, with ``grant`` the grant
    file in it (:func:`grant_file`) read-only over itself, the lock directory (read-only) and, with
    ``preload``, ``/etc/ld.so.preload``. Driver mounts come first on every path, so a driver
    directory mounted over a parent of ``<hook>/vgpu`` cannot hide libvgpu's mounts."""
    mounts = list(paths.driver_mounts)
    if region_dir is None:
        return tuple(mounts)
    mounts += [
        MountSpec(paths.library, paths.library, True),
        MountSpec(paths.vgpu_dir, region_dir, False),
        # read-only: libvgpu keeps its lock in the region and never writes here; HAMi's mount
        # is kept for what expects the path, but rw it was one host directory every GPU tenant
        # of the node could fill (not counted as the pod's storage) and read each other's files in
        MountSpec(CONTAINER_LOCK_DIR, paths.lock_dir, True),
    ]
    if grant:
        mounts.append(MountSpec(f"{paths.vgpu_dir}/{GRANT_FILE}", f"{region_dir}/{GRANT_FILE}", True))
    if preload:
        mounts.append(MountSpec(CONTAINER_PRELOAD, paths.preload_file, True))
    return tuple(mounts)


def deferred_grant() -> dict[str, str]:
    """The env a container gets when its grant is given at creation by the NRI hook
    (``--injection=nri``): the same for every pod, so it needs no pod and no lock; the hook sets
    the GPUs, the limits and ``HAMI_NRI_INJECTION=done`` over it.

    It names no ``NVIDIA_VISIBLE_DEVICES``: containerd puts the image's env and the kubelet's in
    one list without merging names, and its NRI (1.7) gives a name that occurs twice the last of
    those values back over the hook's, so a ``void`` here left every container of an image that
    sets the variable (CUDA's base images: ``all``) with no GPU at all. A container created while
    the hook is away keeps what its image says of the variable, but with :func:`deferred_mounts`
    libvgpu refuses to run it on any GPU; one still ``pending`` when the hook registers again is
    evicted where the runtime carries out NRI evictions (``Injector.synchronized``)."""
    return {NRI_INJECTION: NRI_PENDING}


def deferred_mounts(paths: HookPaths) -> tuple[MountSpec, ...]:
    """The mounts that go with :func:`deferred_grant`: libvgpu, ``/etc/ld.so.preload`` naming it,
    and the pending marker file beside it (:data:`hami.node.layout.PENDING_MARKER`). The hook's
    mounts replace the first two by destination (NRI), and it removes the marker (and the preload
    for ``CUDA_DISABLE_CONTROL``); in a container the hook never served, libvgpu finds the marker
    (file, or the variable still ``pending``) and CUDA and NVML report no device
    (native/libvgpu: ``grant_missing``), whatever GPUs the image's or the pod's own
    ``NVIDIA_VISIBLE_DEVICES`` shows it. The file is what a pod cannot take away: its ``envFrom``
    can replace the variable."""
    return (
        MountSpec(paths.library, paths.library, True),
        MountSpec(CONTAINER_PRELOAD, paths.preload_file, True),
        MountSpec(paths.pending_marker, paths.pending_marker_source, True),
    )


def ld_preload(library: str, current: str = "") -> str:
    """``LD_PRELOAD`` with ``library`` first and no other ``libvgpu.so`` (a process outside a
    container, where no ``/etc/ld.so.preload`` is mounted)."""
    keep = [p for p in current.split(":") if p and Path(p).name != LIBRARY_NAME]
    return ":".join([library, *keep])
