"""AWS Neuron, as HAMi's ``pkg/device/awsneuron`` hands devices to the Neuron device plugin.
Found by an adversarial review:

* several devices were the first free ones in rank order, wherever they were; HAMi's
  ``graphSelect`` takes a contiguous run (a ring on Inferentia, runs of 4 / 8 / 16 aligned on
  their size on Trainium), and the plugin allocates what ``AWS_NEURON_IDS`` names;
* ``NEURON_RESOURCE_TYPE`` said ``neuroncore`` / ``neuron``; HAMi writes the core resource's name
  (``aws.amazon.com/neuroncore``) when the IDs are cores and nothing when they are devices."""

from __future__ import annotations

import pytest

from ._vendorkit import ctr, node, place, pod

DEV, CORE = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"
ALLOCATED = "hami.io/aws-neuron-devices-allocated"


def neuron_node(kind: str | None, devices: int, cores: int = 2) -> dict:
    n = node("n", capacity={DEV: devices, CORE: cores * devices})
    if kind:
        n["metadata"]["labels"]["node.kubernetes.io/instance-type"] = kind
    return n


def held(*indexes: int) -> dict:
    """A placed pod holding whole devices ``indexes`` of node ``n``."""
    p = pod(f"old-{'-'.join(map(str, indexes))}", [ctr(limits={DEV: len(indexes)})])
    value = "".join(f"n-AWSNeuron-{i},AWSNeuron,0,3:" for i in indexes) + ";"
    p["metadata"]["annotations"].update({"hami.io/vgpu-node": "n", ALLOCATED: value})
    return p


def ids(kind: str | None, devices: int, used: tuple[int, ...], limits: dict) -> str | None:
    placed = [held(*used)] if used else []
    r = place([neuron_node(kind, devices)], [pod("p", [ctr(limits=limits)])], placed=placed)[0]
    return r.annotations["AWS_NEURON_IDS"] if r.node else None


@pytest.mark.parametrize(
    "kind,devices,used,limits,expected",
    [
        ("inf2.48xlarge", 12, (1, 3), {DEV: 2}, "4,5"),  # was 0,2: not neighbours on the ring
        ("inf2.48xlarge", 12, (1, 3), {CORE: 4}, "8,9,10,11"),  # cores of devices 4 and 5
        (None, 6, (2,), {DEV: 3}, None),  # no instance type: Trainium's rules, as HAMi reads it
        (None, 8, (1,), {DEV: 4}, "4,5,6,7"),
        ("trn1.32xlarge", 16, (1,), {DEV: 4}, "4,5,6,7"),  # aligned on 4: not 2,3,4,5
        ("trn1.32xlarge", 16, (5,), {DEV: 8}, "8,9,10,11,12,13,14,15"),
        ("inf2.48xlarge", 12, (1, 3, 5, 7, 9, 11), {DEV: 2}, None),  # no two neighbours free
        ("trn1.32xlarge", 16, (), {DEV: 2}, None),  # Trainium takes 1, 4, 8 or 16 devices
        ("trn1.32xlarge", 16, (0, 4, 8, 12), {DEV: 4}, None),  # twelve free, no aligned run of 4
    ],
)
def test_several_devices_are_a_contiguous_run(kind, devices, used, limits, expected):
    assert ids(kind, devices, used, limits) == expected


def test_a_run_that_does_not_exist_is_refused_as_hami_refuses_it():
    r = place([neuron_node("trn1.32xlarge", 16)], [pod("p", [ctr(limits={DEV: 2})])])[0]
    assert r.reasons() == {"n": "16/16 NumaNotFit"}


@pytest.mark.parametrize("limits,kind", [({CORE: 1}, CORE), ({CORE: 2}, CORE), ({DEV: 1}, None)])
def test_the_resource_type_is_hamis(limits, kind):
    r = place([neuron_node("inf2.xlarge", 1)], [pod("p", [ctr(limits=limits)])])[0]
    assert r.annotations.get("NEURON_RESOURCE_TYPE") == kind
