"""AWS Neuron: whole devices or single NeuronCores, from node capacity."""

from __future__ import annotations

import re

import pytest

from hami.core.errors import RequestError

from ._vendorkit import NOW, admit, config, ctr, node, one, place, pod

CFG = config()
DEV, CORE = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"


def inf_node(name: str = "inf", devices: int = 2) -> dict:
    return node(name, capacity={DEV: devices, CORE: 2 * devices})


@pytest.mark.parametrize(
    "limits,message",
    [
        ({CORE: 3}, "aws.amazon.com/neuroncore must be 1 or a multiple of 2 (cores per device), got 3"),
        ({DEV: 1, CORE: 1}, "ask for aws.amazon.com/neuron or aws.amazon.com/neuroncore, not both"),
    ],
)
def test_admission_rejects(limits, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        admit(pod("bad", [ctr(limits=limits)]), CFG)


@pytest.mark.parametrize(
    "limits,allocated,ids,kind",
    [
        ({DEV: 1}, "inf-awsneuron-0,AWSNeuron,0,2:;", "0", "neuron"),
        ({CORE: 4}, "inf-awsneuron-0,AWSNeuron,0,2:inf-awsneuron-1,AWSNeuron,0,2:;", "0,1", "neuron"),
        ({CORE: 1}, "inf-awsneuron-0,AWSNeuron,0,1:;", "0", "neuroncore"),
    ],
)
def test_annotations_exact(limits, allocated, ids, kind):
    r = one([inf_node()], pod("p", [ctr(limits=limits)]))
    assert r.annotations == {
        "hami.io/vgpu-node": "inf",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/aws-neuron-devices-allocated": allocated,
        "AWS_NEURON_IDS": ids,
        "NEURON_ALLOC_TIME": str(int(NOW)),
        "NEURON_ALLOCATED": "false",
        "NEURON_RESOURCE_TYPE": kind,
        "aws.amazon.com/predicate-node": "inf",
    }


def test_second_core_of_a_device():
    pods = [
        pod("a", [ctr(limits={CORE: 1})]),
        pod("b", [ctr(limits={CORE: 1})], {"hami.io/gpu-scheduler-policy": "binpack"}),
    ]
    results = place([inf_node()], pods)
    assert results[1].annotations["hami.io/aws-neuron-devices-allocated"] == "inf-awsneuron-0,AWSNeuron,0,1:;"
    assert results[1].annotations["AWS_NEURON_IDS"] == "1"


@pytest.mark.parametrize(
    "first,second,reason",
    [
        ({CORE: 1}, {DEV: 1}, "1/1 ExclusiveDeviceAllocateConflict"),
        ({CORE: 2}, {CORE: 1}, "1/1 CardTimeSlicingExhausted"),
    ],
)
def test_misfits(first, second, reason):
    results = place([inf_node(devices=1)], [pod("a", [ctr(limits=first)]), pod("b", [ctr(limits=second)])])
    assert results[1].reasons() == {"inf": reason}
