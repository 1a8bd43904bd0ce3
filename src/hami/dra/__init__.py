"""The DRA device model of the driver ``gpu.hami.io``: pure, no I/O, imports only :mod:`hami.core`
(and the CEL library ``common-expression-language``, which does no I/O either).

On the DRA path kube-scheduler places claims itself; hami publishes what exists and prepares what
was granted. This package is what every reader of DRA objects shares (the scheduler's quotas and
UI, the webhook's translation, ``hami simulate --front-end dra``, the node agent):

- :mod:`hami.dra.model`: the node's GPUs as ResourceSlice devices with consumable capacity, and
  the DeviceClasses;
- :mod:`hami.dra.claims`: what an allocated ResourceClaim holds of the driver's GPUs, the one
  reader of allocations;
- :mod:`hami.dra.cel`: CEL device selectors in the environment kube-scheduler gives them;
- :mod:`hami.dra.fit`: kube-scheduler's allocator as far as the simulation needs it;
- :mod:`hami.dra.explain`: why a claim does not fit;
- :mod:`hami.dra.translate`: a HAMi pod's resources -> a ResourceClaimTemplate;
- :mod:`hami.dra.gpuconfig`: the rules of a ``GpuConfig``, which the node agent applies at
  prepare and the webhook at a claim's or template's creation.

The node agent (kubelet plugin, prepare, checkpoint, publisher, ``hami dra``) is
:mod:`hami.draplugin`, one floor up. See docs/dra.md.
"""
