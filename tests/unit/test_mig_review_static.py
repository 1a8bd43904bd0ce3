"""Adversarial review of static MIG (``migstrategy: mixed``): the resource names the instances
are advertised under."""

from __future__ import annotations

import re

from hami.deviceplugin import static_mig
from hami.node.nvml import Instance

A100 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
T4 = "GPU-bbbbbbbb-0000-4000-8000-000000000001"

#: Kubernetes' rule for the name part of an extended resource (a qualified name)
QUALIFIED = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def test_a_media_extension_profile_gets_nvidias_resource_name(monkeypatch):
    """NVML names the media-extension profiles ``1g.10gb+me``: advertised as such the resource
    ``nvidia.com/mig-1g.10gb+me`` is no valid resource name (the kubelet refuses to register
    it) and not the name pods ask for with NVIDIA's plugin, ``nvidia.com/mig-1g.10gb.me``."""

    class Mig:
        def instances(self, uuid):
            return [
                Instance(1, "1g.10gb+me", 0, 2, 0, "MIG-1"),
                Instance(2, "1g.10gb", 2, 2, 0, "MIG-2"),
                Instance(3, "3g.40gb", 4, 4, 0, "MIG-3"),
            ]

    monkeypatch.setattr(static_mig, "MigNvml", Mig)
    monkeypatch.setattr(static_mig, "mig_enabled", lambda uuid: uuid == A100)
    found = static_mig.discover_static([A100, T4])
    assert found == {
        "nvidia.com/mig-1g.10gb": ["MIG-2"],
        "nvidia.com/mig-1g.10gb.me": ["MIG-1"],
        "nvidia.com/mig-3g.40gb": ["MIG-3"],
    }
    for name in found:
        assert QUALIFIED.fullmatch(name.split("/", 1)[1]), name
    [me] = [r for r in static_mig.resources(found) if r.settings.resource_name.endswith(".me")]
    assert me.settings.socket_name == "nvidia-mig-1g.10gb.me.sock"
