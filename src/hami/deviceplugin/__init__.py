"""`hami device-plugin`: the node agent for NVIDIA GPUs (kubelet device plugin API v1beta1).

Modules: ``api`` (gRPC stubs), ``discovery`` (NVML), ``nodeconfig`` (config.json overlay),
``allocate`` (pure Allocate logic), ``kube`` (API-server access), ``register`` (node
registration annotation), ``server`` (gRPC servicer + kubelet registration), ``preflight``,
``command`` (CLI).
"""
