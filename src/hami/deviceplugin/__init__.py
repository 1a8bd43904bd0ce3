"""`hami device-plugin`: the node agent for NVIDIA GPUs (kubelet device plugin API v1beta1).

Modules: ``api`` (gRPC stubs), ``devices`` (kubelet IDs, health, registration content),
``allocate`` (pure Allocate logic), ``allocator`` (the Allocate flow against the API server),
``kube`` (API-server access), ``register`` (node registration annotation), ``server`` (gRPC
servicer + kubelet registration), ``mig`` / ``static_mig`` (dynamic and static MIG),
``topology`` (pair scores), ``preflight``, ``agent`` (the parts together), ``command`` (CLI).
NVML, node settings, the host layout, the libvgpu container contract, CDI and durable files come
from the node floor (:mod:`hami.node`), shared with the DRA agent, the monitor and ``hami exec``.
"""
