"""Every ``hami.io`` wire name the product reads or writes, spelled here and nowhere else.

This module owns the annotation, label and DRA/CDI names that cross a process boundary and
that more than one backend (or more than one program) uses. It holds constants and small
functions that compose a key from a backend's word; it imports nothing and does nothing else.

It does not own:

* a vendor's own keys (registration, allocation and selection annotations of one backend,
  e.g. ``hami.io/node-nvidia-register`` or ``hami.io/Vastai-devices-allocated``): those stay in
  that vendor's module under ``hami.vendors``, spelled once there;
* resource names (``nvidia.com/gpu``) and other vendors' domains: the vendor modules;
* how libvgpu's environment is composed from a grant: the node contract
  (:mod:`hami.node.contract`); the variables' *names* are here, below every writer.

The keys, their writer and their readers (the HAMi-compatible ones as in HAMi v2.10; "beyond
HAMi" marks ours). Pod annotations and labels:

* ``VGPU_NODE``: the scheduler's Filter writes it (annotation and label); the scheduler's cache,
  its rebuild, the node lock checks and the device plugin's pod lookup read it.
* ``VGPU_TIME``: the scheduler's Filter writes it (unix seconds); only the webhook reads it (a
  user may not set it).
* ``BIND_PHASE``: Bind writes ``allocating``, the device plugin ``success`` or ``failed``; the
  scheduler's cache, the node lock, ``hami explain`` and the UI read it.
* ``BIND_TIME``: Bind writes it; the device plugin's fallback pod lookup reads it.
* ``VGPU_MIG_ALLOCATIONS``: the scheduler (NVIDIA backend) writes the MIG reservations; the
  scheduler's rebuild, the device plugin and the monitor read them.
* ``NODE_SCHEDULER_POLICY`` / ``GPU_SCHEDULER_POLICY`` / ``DEVICE_SCORING_WEIGHTS``: the user
  writes them; the scheduler's scoring reads them.
* ``SCHEDULER_ROLE``: the leading scheduler labels scheduler pods ``leader``/``follower``; the
  chart's Service selects on it.

Node annotations and namespace labels:

* ``NODE_LOCK``: the scheduler takes it at Bind; the device plugin (or the scheduler) clears
  it. Shared by every backend that locks (vendors set it as their ``lock_annotation``).
* ``NODE_LOCK_HANDOFF`` (beyond HAMi): the device plugin writes ``swap`` when it leaves a
  finished pod's lock for the next Bind to take over; the scheduler reads it.
* ``NODE_INJECTION`` (beyond HAMi): the device plugin writes ``nri`` once it is registered with
  the container runtime's NRI socket and gives each container its grant at creation from the
  pod's annotations; the scheduler then binds a pod to that node without the node lock
  (docs/nri.md). Absent or any other value: HAMi's lock protocol.
* ``DEVICE_CORDON``: the operator writes a list of UUIDs; the scheduler's ledger reads it.
* ``NODE_HANDSHAKE`` and :func:`node_handshake`: the scheduler writes ``Requesting_<time>`` and
  reads it back to judge a backend's node side alive (NVIDIA's key has no suffix).
* ``NODE_ANNOTATION_PREFIX``: not a key; the scheduler notices node changes by the annotations
  under it (registrations, handshakes, scores).
* ``ALLOW_DISABLE_CONTROL``: the operator labels a namespace ``true``; the webhook reads it
  (the default of ``--disable-control-label``).

Per-chip backends (Ascend, Iluvatar) name their keys after the chip's word: the vendor module
calls :func:`devices_allocated`, :func:`devices_to_allocate`, :func:`use_uuid` and
:func:`no_use_uuid` (the scheduler writes the first two, the vendor's device plugin reads them;
the user writes the last two). :func:`is_devices_to_allocate` tells any backend's
to-allocate key: the scheduler's lock handling and our device plugin read them all, so that a pod
still owed another vendor's devices has not finished its allocation. :func:`is_allocation_annotation`
tells either key of any backend's pair: the webhook strips them from new pods (only the scheduler
writes them).

The DRA front end and CDI (beyond HAMi):

* ``DRA_DRIVER``: the DRA agent publishes ResourceSlices and CDI kinds under it; the scheduler,
  the UI and ``hami simulate`` read the claims allocated by it.
* ``DRA_SHARE_CLASS`` / ``DRA_WHOLE_CLASS``: the chart (or ``hami dra``) creates the two
  DeviceClasses; the webhook's DRA translation asks for the share class; the DRA fit reads both.
* ``DRA_CONFIG_API_VERSION``: the apiVersion of the class configuration that the DeviceClasses
  carry and the DRA agent reads at prepare.
* ``DRA_CDI_KIND``: the kind of the CDI spec the DRA agent writes per claim; the kubelet passes
  its device names to the container runtime, which reads the spec.
* ``CDI_KIND``: the device plugin's CDI spec kind (``--cdi-kind`` default); the container
  runtime reads it.

Environment variables the product writes into a container (or a ``hami exec`` process), read by
libvgpu, the NVIDIA container runtime or CUDA; the node contract composes them from a grant, the
NVIDIA backend's admission defaults and the webhook name a few:

* ``ENV_VISIBLE_DEVICES``: the GPUs the NVIDIA container runtime shows the container.
* ``ENV_CUDA_VISIBLE_DEVICES``: the GPUs CUDA shows a process (``hami exec``).
* ``ENV_MEMORY_LIMIT``: the memory limit; ``_<i>`` per visible device, unsuffixed for all.
* ``ENV_SM_LIMIT``: the compute share in percent.
* ``ENV_SHARED_CACHE``: the shared-region file.
* ``ENV_OVERSUBSCRIBE``: ``true`` when the node oversubscribes memory.
* ``ENV_LOG_LEVEL``: libvgpu's log level.
* ``ENV_TASK_PRIORITY``: 0 high, 1 low.
* ``PRIORITY_RANGE``: the values of it a pod may ask for; the webhook checks the priority resource
  against it, the DRA translation and the DRA agent a ``GpuConfig``'s ``priority``, the monitor a
  claim file's. ``DEFAULT_PRIORITY``: libvgpu's value without it; the DRA agent and the monitor
  read it.
* ``ENV_CORE_POLICY``: default / force / disable.
* ``ENV_DISABLE_CONTROL``: ``true`` in a container's env: no ``/etc/ld.so.preload`` (the
  webhook gates who may set it).
* ``ENV_PEER_REGIONS`` (beyond HAMi): the directory of the regions a process's priority pauses
  across.
* ``ENV_LD_PRELOAD``: the dynamic loader's preload list (``hami exec``).
* ``ENV_NRI_INJECTION`` (beyond HAMi): ``pending`` in a container that the device plugin's
  Allocate answered in NRI mode, ``done`` once the NRI hook has given it its grant (docs/nri.md).
* ``GRANT_ENV``, ``GRANT_ENV_PREFIX`` and :func:`grant_env` (beyond HAMi): the variables only a
  grant may set (libvgpu's limits and tuning, ``ENV_LIMITER_TUNING`` (its compute-share
  controller's knobs), the region file, the NRI marker); the webhook
  refuses them in a device pod's env, the chart's device-pod guard spells the same list, and the
  NRI hook removes those its grant does not set (docs/security.md).
* ``ENV_GRANT_DEVICES`` (beyond HAMi): the UUIDs of the GPUs a grant names, comma-separated, in
  the grant file (and a DRA claim's CDI spec); libvgpu gives no device to a process that sees
  another (a pod's own ``NVIDIA_VISIBLE_DEVICES``). Empty or unset: no check (HAMi-core's contract).
* ``GRANT_FILE`` and ``PENDING_MARKER`` (beyond HAMi): file names libvgpu looks up in its mount
  table. The device plugin writes the grant file into a container's region directory and mounts
  it read-only at ``<hook>/vgpu/hami-grant.env``; libvgpu reads its settings from it over the
  environment. In NRI mode Allocate mounts the pending marker and the hook removes it; libvgpu
  finding it gives no device. The webhook refuses a pod's own volume mount of either name.
"""

# ---- pod annotations and labels (scheduler <-> device plugin, §5)
VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
VGPU_MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"
DEVICE_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
SCHEDULER_ROLE = "hami.io/scheduler-role"

# ---- node annotations, namespace labels
NODE_LOCK = "hami.io/mutex.lock"
NODE_LOCK_HANDOFF = "hami.io/node-lock-handoff"
NODE_INJECTION = "hami.io/node-injection"
DEVICE_CORDON = "hami.io/device-cordon"
NODE_HANDSHAKE = "hami.io/node-handshake"
NODE_ANNOTATION_PREFIX = "hami.io/node-"
ALLOW_DISABLE_CONTROL = "hami.io/allow-disable-control"

# ---- the DRA driver and the device plugin's CDI kind
DRA_DRIVER = "gpu.hami.io"
DRA_SHARE_CLASS = DRA_DRIVER  # the share class carries the driver's name
DRA_WHOLE_CLASS = "whole-gpu.hami.io"
DRA_CONFIG_API_VERSION = "gpu.hami.io/v1alpha1"
DRA_CDI_KIND = f"{DRA_DRIVER}/claim"
CDI_KIND = "hami.io/gpu"

_DOMAIN = "hami.io/"


def node_handshake(word: str) -> str:
    """The handshake annotation of a backend other than NVIDIA: ``hami.io/node-handshake-<word>``."""
    return f"{NODE_HANDSHAKE}-{word}"


def devices_allocated(word: str) -> str:
    """``hami.io/<word>-devices-allocated``: a per-chip backend's decision, kept on the pod."""
    return f"{_DOMAIN}{word}-devices-allocated"


def devices_to_allocate(word: str) -> str:
    """``hami.io/<word>-devices-to-allocate``: what the backend's device plugin still has to hand out."""
    return f"{_DOMAIN}{word}-devices-to-allocate"


def is_devices_to_allocate(key: str) -> bool:
    """``key`` is some backend's :func:`devices_to_allocate` annotation."""
    return key.startswith(_DOMAIN) and key.endswith("-devices-to-allocate")


def is_allocation_annotation(key: str) -> bool:
    """``key`` is some backend's allocation pair (:func:`devices_allocated` or
    :func:`devices_to_allocate`; a ``hami.io/`` key ending ``-allocated`` or ``-to-allocate``, as
    the chart's allocation guard matches them), enabled in this install or not."""
    return key.startswith(_DOMAIN) and key.endswith(("-allocated", "-to-allocate"))


def use_uuid(word: str) -> str:
    """``hami.io/use-<word>-uuid``: the pod's list of device UUIDs it may use."""
    return f"{_DOMAIN}use-{word}-uuid"


def no_use_uuid(word: str) -> str:
    """``hami.io/no-use-<word>-uuid``: the pod's list of device UUIDs it must not use."""
    return f"{_DOMAIN}no-use-{word}-uuid"


# ---- environment variables written for libvgpu, the container runtime and CUDA
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ENV_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
ENV_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"
ENV_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
ENV_OVERSUBSCRIBE = "CUDA_OVERSUBSCRIBE"
ENV_LOG_LEVEL = "LIBCUDA_LOG_LEVEL"
ENV_TASK_PRIORITY = "CUDA_TASK_PRIORITY"
#: the ``CUDA_TASK_PRIORITY`` values a pod may ask for, 0 high, 1 low: libvgpu (native/libvgpu/
#: config.c) reads -1000..1000 and stops the process on any other value, and the API server
#: refuses a negative extended resource. The webhook admits these for the priority resource and a
#: DRA ``GpuConfig`` may name them, so the two front ends agree by construction.
PRIORITY_RANGE = (0, 1000)
#: libvgpu's priority when ``CUDA_TASK_PRIORITY`` is unset (native/libvgpu/config.c)
DEFAULT_PRIORITY = 1
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"
ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"
ENV_PEER_REGIONS = "HAMI_PEER_REGIONS"
ENV_LD_PRELOAD = "LD_PRELOAD"
ENV_NRI_INJECTION = "HAMI_NRI_INJECTION"
ENV_GRANT_DEVICES = "HAMI_GRANT_DEVICES"

#: files libvgpu finds by name in its process's mount table (native/libvgpu/config.c and
#: cuda_hooks.c): the grant, mounted read-only at ``<hook>/vgpu/hami-grant.env`` (its settings
#: over the environment's), and the NRI mode's pending marker (no device until the hook served the
#: container). The webhook refuses a pod's own volume mount of either name.
GRANT_FILE = "hami-grant.env"
PENDING_MARKER = "grant-pending"
#: libvgpu's compute-share controller (native/libvgpu/limiter.c, docs/compute-shares.md): its
#: period, the priority's quiet time, the contention hold and the two averaging windows; a pod
#: setting them could loosen its own cap (``HAMI_CONTENTION_HOLD_MS=0``)
ENV_LIMITER_TUNING = (
    "HAMI_LIMITER_TICK_MS",
    "HAMI_PRIORITY_QUIET_MS",
    "HAMI_CONTENTION_HOLD_MS",
    "HAMI_LIMITER_WINDOW_MS",
    "HAMI_LIMITER_SHARED_WINDOW_MS",
)
#: set by the grant only (or left to libvgpu's defaults); any ``_`` suffix (``_<i>``, per device) too
GRANT_ENV = (
    ENV_MEMORY_LIMIT,
    ENV_SM_LIMIT,
    ENV_SHARED_CACHE,
    ENV_OVERSUBSCRIBE,
    ENV_PEER_REGIONS,
    ENV_NRI_INJECTION,
    *ENV_LIMITER_TUNING,
)
#: libvgpu's own tuning and test variables (``LIBVGPU_CONTEXT_SIZE``, ...)
GRANT_ENV_PREFIX = "LIBVGPU_"


def grant_env(name: str) -> bool:
    """Is ``name`` a variable only a grant sets? A container's env comes after the device
    plugin's in the runtime's list, so one set by the pod would replace the grant's value."""
    return name.startswith(GRANT_ENV_PREFIX) or any(name == n or name.startswith(n + "_") for n in GRANT_ENV)
