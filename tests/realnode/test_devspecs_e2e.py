"""``devicePlugin.passDeviceSpecsEnabled: true`` (HAMi's default) end to end on the real node: the
chart installed from the product image with ``devicePlugin.devRoot`` a directory of its own whose
``dev/`` holds character devices made with mknod (clones of /dev/null standing for the GPUs'
/dev/nvidia<minor> and /dev/nvidiactl; the fake driver's minor numbers are its indexes), and a GPU
pod that finds the node of its own GPU, and only that one, in its /dev as a character device: the
kubelet made it from the plugin's DeviceSpecs (no NVIDIA container runtime on this node)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hami_devkit.cluster import KubeCluster

from . import test_chart_e2e as e2e
from .product import FAKE_GPUS, Product, installed
from .test_chart_e2e import probe_container, probe_output, probe_pod

#: the probe's namespace fixture of test_chart_e2e.py, here over this module's product
gpu_namespace = e2e.gpu_namespace
NULL = os.makedev(1, 3)  # /dev/null's numbers: a harmless character device to stand for a GPU's


def make_dev_root(root: Path) -> Path:
    dev = root / "dev"
    dev.mkdir(parents=True)
    for name in [f"nvidia{i}" for i in range(len(FAKE_GPUS))] + ["nvidiactl"]:
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, NULL)
    return root


@pytest.fixture(scope="module")
def product(real_node_holder, real_cluster: KubeCluster, tmp_path_factory, request):
    root = make_dev_root(tmp_path_factory.mktemp("devspecs-root"))
    yield from installed(
        real_node_holder,
        real_cluster,
        tmp_path_factory.mktemp("product-devspecs"),
        request,
        extra_values={
            "devicePlugin": {"passDeviceSpecsEnabled": True, "nvidiaDriverRoot": "auto", "devRoot": str(root)}
        },
        label="devspecs",
    )


def test_a_gpu_pod_gets_its_gpus_device_node_from_the_device_specs(
    product: Product, real_cluster: KubeCluster, gpu_namespace: str
):
    pod = probe_pod("devspecs", [probe_container(product, "c", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, [])])
    real_cluster.api("POST", f"/api/v1/namespaces/{gpu_namespace}/pods", pod)
    out = probe_output(real_cluster, gpu_namespace, "devspecs", "c")
    uuid = out["env"]["NVIDIA_VISIBLE_DEVICES"]
    minor = next(i for i, g in enumerate(FAKE_GPUS) if g.endswith(f"uuid={uuid}"))
    # its own GPU's node and the control node, as character devices; no other GPU's node
    assert out["dev_nodes"] == {f"nvidia{minor}": "char", "nvidiactl": "char"}, out
    assert out["cuInit"] == 0 and out["cuMemGetInfo"] == 0  # the driver still works under libvgpu
