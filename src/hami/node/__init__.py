"""The node floor: what every node program shares (``hami device-plugin``, ``hami dra``,
``hami monitor``, ``hami exec``), one concept per module, below all of them.

- :mod:`hami.node.nvml`: the one door to NVML (loading, discovery, health events, MIG calls,
  topology, host readings);
- :mod:`hami.node.settings`: node settings (``device-config.yaml`` ``nvidia`` section and the
  ``config.json`` overlay);
- :mod:`hami.node.layout`: the host layout libvgpu needs (hook dir, library, ``ld.so.preload``,
  region directories, lock directory, driver directories);
- :mod:`hami.node.contract`: the libvgpu container contract (a grant -> env, region, mounts);
- :mod:`hami.node.files`: the one atomic, durable file writer (checkpoints, CDI specs, records);
- :mod:`hami.node.cdi`: CDI spec writing;
- :mod:`hami.node.flags`: the command-line flags node programs share;
- :mod:`hami.node.mig`: dynamic MIG instances made and destroyed, with their checkpoint (the
  device plugin's ``operatingmode: mig`` and the DRA agent's partitionable devices);
- :mod:`hami.node.nri`: the NRI plugin client (the device plugin's ``--injection=nri``).

It imports only ``hami.core``, ``hami.config`` and ``hami.kube``; the node programs import it and
nothing of each other (a program's ``command.py`` wires; it does not borrow another's modules).
"""
