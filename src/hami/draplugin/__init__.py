"""`hami dra`: the node agent of the DRA front end (driver ``gpu.hami.io``).

Parts, one concern each, over the pure model in :mod:`hami.dra`:

- :mod:`hami.draplugin.publisher`: writes the node's ResourceSlice and the DeviceClasses (API I/O);
- :mod:`hami.draplugin.prepare`: a claim's allocation -> libvgpu's environment as a CDI spec (pure);
- :mod:`hami.draplugin.checkpoint`: what was prepared, kept on the node across restarts;
- :mod:`hami.draplugin.plugin`: the kubelet's DRA v1 and registration gRPC services;
- :mod:`hami.draplugin.command`: ``hami dra`` wiring discovery, publisher and plugin.

It shares discovery, node settings and the libvgpu container contract with the device plugin
through :mod:`hami.node`, and imports nothing of the extender path (``hami.scheduler``).
"""
