"""The pool generation of the node's ResourceSlice: raised whenever anything the driver says of a
device changes (resource.k8s.io: "whenever a driver changes something about one or more of the
resources in a pool, it must change the generation"), kept when a publish only repeats what the
API server stored in its own form."""

import asyncio
import copy
from dataclasses import replace

from hami.dra.model import SliceSettings
from hami.draplugin.publisher import publish_slice
from hami.kube.client import KubeError
from hami.node.nvml import PhysicalGPU

GPUS = [
    PhysicalGPU(0, "GPU-aaaaaaaa-0000-4000-8000-000000000000", "Tesla T4", 15360, "0000:3b:00.0", 0),
    PhysicalGPU(1, "GPU-bbbbbbbb-0000-4000-8000-000000000001", "Tesla T4", 15360, "0000:3c:00.0", 0),
]
GIB = 1 << 30


class Api:
    """One stored slice, written back as an API server does: whole GiB quantities as ``<n>Gi``
    and a ``timeAdded`` on every taint."""

    def __init__(self):
        self.stored = None

    async def get(self, path, **query):
        if self.stored is None:
            raise KubeError("GET", path, 404, "not found")
        return self.stored

    async def request(self, method, path, query=None, body=None, content_type=None):
        assert method == "PATCH"
        obj = copy.deepcopy(body)
        for d in obj["spec"]["devices"]:
            for cap in (d.get("capacity") or {}).values():
                if cap["value"].isdigit() and int(cap["value"]) % GIB == 0:
                    cap["value"] = f"{int(cap['value']) // GIB}Gi"
            for t in d.get("taints") or ():
                t["timeAdded"] = "2026-01-01T00:00:00Z"
        self.stored = obj
        return obj


def publish(api, settings, **kw):
    return asyncio.run(publish_slice(api, "node-a", GPUS, settings, **kw))["spec"]["pool"]["generation"]


def test_a_new_driver_version_raises_the_pool_generation():
    api = Api()
    assert publish(api, SliceSettings(driver_version="550.54.15")) == 1
    # the agent restarted after a driver upgrade: every device's driverVersion attribute changed
    # (before: only names, UUIDs, capacities and taints were compared, and it stayed 1)
    assert publish(api, SliceSettings(driver_version="560.35.3")) == 2
    assert api.stored["spec"]["devices"][0]["attributes"]["driverVersion"] == {"version": "560.35.3"}


def test_a_new_cores_default_raises_the_pool_generation():
    api = Api()
    s = SliceSettings(driver_version="550.54.15")
    assert publish(api, s) == 1
    assert publish(api, replace(s, default_cores=20)) == 2  # the cores' requestPolicy default changed


def test_the_same_content_in_the_api_servers_form_keeps_the_generation():
    api = Api()
    s = SliceSettings(driver_version="550.54.15")
    bad = frozenset({GPUS[1].uuid})
    assert publish(api, s, unhealthy=bad, taint="NoSchedule") == 1
    assert api.stored["spec"]["devices"][0]["capacity"]["memory"]["value"].endswith("Gi")
    assert publish(api, s, unhealthy=bad, taint="NoSchedule") == 1
    assert publish(api, s) == 2  # the taint went
