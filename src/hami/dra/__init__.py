"""`hami dra`: the Dynamic Resource Allocation front end for NVIDIA GPUs (driver ``gpu.hami.io``).

On this path kube-scheduler places claims itself; hami publishes what exists and prepares what
was granted. Parts, one concern each:

- :mod:`hami.dra.model`: the node's GPUs as ResourceSlice devices with consumable capacity, and
  the DeviceClasses (pure);
- :mod:`hami.dra.publisher`: writes the node's ResourceSlice and the DeviceClasses (API I/O);
- :mod:`hami.dra.claims`: what an allocated ResourceClaim holds of the driver's GPUs, the one
  reader of allocations (pure; the scheduler's quotas and UI, ``--explain``);
- :mod:`hami.dra.prepare`: a claim's allocation -> libvgpu's environment as a CDI spec (pure);
- :mod:`hami.dra.checkpoint`: what was prepared, kept on the node across restarts;
- :mod:`hami.dra.plugin`: the kubelet's DRA v1 and registration gRPC services;
- :mod:`hami.dra.command`: ``hami dra`` wiring discovery, publisher and plugin.

It shares discovery, settings and libvgpu with the device plugin front end and imports nothing
of the extender path (``hami.scheduler``). See docs/dra.md.
"""
