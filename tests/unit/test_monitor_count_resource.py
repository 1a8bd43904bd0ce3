"""The monitor's count resource is configured (``--resource-name``, the chart's resourceName), not
guessed among ``--resource-names`` (found by review, 1 Dec).

With all four NVIDIA names custom (resourceName, resourceMem, resourceMemPercentage, resourceCores:
acme.com/vgpu, acme.com/vmem, acme.com/vmem-pct, acme.com/vcores) the monitor could tell no count
among them and took a container naming any of them as asking for GPUs: an init container with
``acme.com/vgpu: "0"``, or with ``acme.com/vmem`` alone, took the GPU container's entry of HAMi
v2.10's compact allocation (the entries of its GPU containers alone), so the monitor exported and
fed back the wrong container's region. Each test failed on the code before the fix.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace as NS

import pytest
from kubernetes_asyncio import client as kclient

from hami.monitor import command
from hami.monitor import kube as mkube
from hami.monitor.exporter import ContainerGrant
from hami.monitor.kube import container_grants

from .test_chart_review_hami_values import HELM, docs, pod, render
from .test_monitor_review_churn import _FakeCore

COUNT, MEM, PCT, CORES = "acme.com/vgpu", "acme.com/vmem", "acme.com/vmem-pct", "acme.com/vcores"
GPU = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
#: HAMi v2.10's allocation of the pod below: one entry, main's (its only GPU container)
COMPACT = {"hami.io/vgpu-devices-allocated": f"{GPU},NVIDIA,20000,30:;"}
MAIN_LIMITS = {COUNT: "1", MEM: "20000", CORES: "30"}
#: init containers that name the vendor's resources without a count above 0: given no entry
PREPS = pytest.mark.parametrize(
    "prep_limits", [{COUNT: "0"}, {MEM: "8000"}, {PCT: "50", CORES: "10"}], ids=["count-0", "mem-only", "pct-cores"]
)


def _ctr(name: str, limits: dict[str, str] | None) -> NS:
    """A container as kubernetes_asyncio's V1Container shows it to the monitor."""
    return NS(name=name, resources=NS(limits=limits, requests=None) if limits is not None else None)


def _args(*argv: str) -> argparse.Namespace:
    """``hami monitor`` flags as the monitor checks them (:func:`hami.monitor.command._check`)."""
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    args = p.parse_args(["--standalone", "--no-nvml", *argv])
    command._check(args)
    return args


def _configured() -> argparse.Namespace:
    return _args(f"--resource-names={CORES},{COUNT},{MEM},{PCT}", f"--resource-name={COUNT}")


@PREPS
def test_an_init_container_not_counting_gpus_does_not_take_the_gpu_containers_entry(prep_limits):
    """Found by review, 1 Dec: all four names custom, [prep (count 0 / memory only)], [main]: the
    compact entry went to prep, main's region was neither exported nor fed back."""
    args = _configured()
    containers = [_ctr("prep", prep_limits), _ctr("main", MAIN_LIMITS)]
    got = container_grants(COMPACT, containers, "acme.com/priority", 1, args.resources, args.count_resource)
    assert got == (ContainerGrant("main", (GPU,), 1, memory_mib=((GPU, 20000),)),)


def test_a_request_only_count_asks_and_main_keeps_its_own_entry_in_todays_layout():
    """Found by review, 1 Dec (the same names): the count read from the requests asks as well; and
    today's layout, one entry per container, is read in order."""
    args = _configured()
    prep = _ctr("prep", {MEM: "8000"})
    main = NS(name="main", resources=NS(limits=None, requests={COUNT: "1"}))
    grants = container_grants(COMPACT, [prep, main], "acme.com/priority", 1, args.resources, args.count_resource)
    assert [g.container for g in grants] == ["main"]
    today = {"hami.io/vgpu-devices-allocated": f";{GPU},NVIDIA,20000,30:;"}
    grants = container_grants(today, [prep, main], "acme.com/priority", 1, args.resources, args.count_resource)
    assert [g.container for g in grants] == ["main"]


async def test_the_pod_list_gives_main_its_grant_with_the_configured_count(monkeypatch):
    """Found by review, 1 Dec: the same pod through the monitor's pod list (node_pods, as the
    refresh loop calls it with the flags): prep took main's entry."""
    args = _configured()
    _FakeCore.pods = [
        {
            "metadata": {"name": "train", "namespace": "ml", "uid": "uid-1", "annotations": COMPACT},
            "spec": {
                "nodeName": "n1",
                "initContainers": [{"name": "prep", "resources": {"limits": {COUNT: "0"}}}],
                "containers": [{"name": "main", "resources": {"limits": MAIN_LIMITS}}],
            },
            "status": {"phase": "Running"},
        }
    ]
    monkeypatch.setattr(kclient, "CoreV1Api", _FakeCore)
    monkeypatch.setattr(mkube, "_LISTED", {})
    monkeypatch.setattr(mkube, "_SINCE_CONSISTENT", {})
    pods = await mkube.node_pods(object(), "n1", "acme.com/priority", args.resources, args.count_resource)
    assert [g.container for g in pods["uid-1"].grants] == ["main"]


def test_the_count_is_one_of_the_asking_names_and_defaults_to_nvidias():
    """--resource-name is added to --resource-names when they leave it out; NVIDIA's by default."""
    args = _args(f"--resource-names={MEM},{CORES}", f"--resource-name= {COUNT} ")
    assert args.count_resource == COUNT and args.resources == frozenset({COUNT, MEM, CORES})
    assert _args().count_resource == "nvidia.com/gpu"


@pytest.mark.skipif(not HELM.is_file(), reason=f"helm not installed in {HELM.parent} (make kube)")
def test_the_chart_passes_its_resource_name_to_the_monitor(tmp_path):
    """Found by review, 1 Dec: the chart passed the four names but not which one counts."""
    values = {"resourceName": COUNT, "resourceMem": MEM, "resourceMemPercentage": PCT, "resourceCores": CORES}
    cmd = pod(docs(render(tmp_path, values)), "DaemonSet", "t-hami-vgpu-monitor")["containers"][0]["command"]
    assert f"--resource-name={COUNT}" in cmd and f"--resource-names={CORES},{COUNT},{MEM},{PCT}" in cmd
    default = pod(docs(render(tmp_path, {})), "DaemonSet", "t-hami-vgpu-monitor")["containers"][0]["command"]
    assert not any(a.startswith("--resource-name") for a in default)
