"""Property test across vendors: random pods of every vendor on one mixed cluster never push a
device past its slots, memory or cores (in the vendor's own units: AMD compute units, Enflame
slices, Moore Threads cores, NeuronCores), and every placement is on the requested vendor."""

from __future__ import annotations

import pytest

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.core import rebuild, schedule_pod
from hami.core.errors import RequestError

from ._vendorkit import NOW, admit, config, ctr, node, pod

CFG = config()
VENDOR_OF = {name: v.name for v in CFG.vendors for name in (v.resources.count, v.resources.cores) if name}


def _cluster() -> list[dict]:
    npus = [
        {
            "id": f"npu-{i}",
            "index": i,
            "count": 4,
            "devmem": 65536,
            "devcore": 20,
            "type": "Ascend910B3",
            "health": True,
            "custominfo": {"NetworkID": i // 2},
        }
        for i in range(4)
    ]
    amd = [
        {
            "id": f"amd-{i}",
            "index": i,
            "count": 4,
            "devmem": 65536,
            "devcore": 120,
            "type": "AMD Instinct MI210",
            "health": True,
        }
        for i in range(2)
    ]
    drs = {"devices": [{"index": 0, "minor": 0, "capacity": 6}], "profiles": {"1g.8gb": 1, "2g.16gb": 2, "3g.24gb": 3}}
    return [
        node("npu", {"hami.io/node-register-Ascend910B3": json.dumps(npus)}),
        node("mlu", capacity={"cambricon.com/mlu.smlu.vcore": 200, "cambricon.com/mlu.smlu.vmemory": 128}),
        node("dcu", {"hami.io/node-dcu-register": "d0,4,16000,100,DCU,0,true:d1,4,16000,100,DCU,0,true:"}),
        node("mt", capacity={"mthreads.com/sgpu-core": 32, "mthreads.com/sgpu-memory": 192}),
        node("amd", {"hami.io/node-amd-register": json.dumps(amd)}),
        node("gcu", {"enflame.com/gcu-drs-capacity": json.dumps(drs)}, {"enflame.com/gcu": 2}),
        node("kl", capacity={"kunlunxin.com/xpu": 4}),
        node("inf", capacity={"aws.amazon.com/neuron": 2, "aws.amazon.com/neuroncore": 4}),
        node("mx", capacity={"metax-tech.com/gpu": 2}),
    ]


LIMITS = st.one_of(
    st.fixed_dictionaries({"huawei.com/Ascend910B3": st.integers(1, 2)}),
    st.fixed_dictionaries(
        {"huawei.com/Ascend910B3": st.just(1), "huawei.com/Ascend910B3-memory": st.sampled_from([1000, 16384, 20000])}
    ),
    st.fixed_dictionaries(
        {
            "cambricon.com/vmlu": st.integers(1, 2),
            "cambricon.com/mlu.smlu.vmemory": st.integers(1, 64),
            "cambricon.com/mlu.smlu.vcore": st.integers(0, 100),
        }
    ),
    st.fixed_dictionaries(
        {
            "hygon.com/dcunum": st.integers(1, 2),
            "hygon.com/dcumem": st.integers(1, 9000),
            "hygon.com/dcucores": st.integers(0, 100),
        }
    ),
    st.fixed_dictionaries(
        {
            "mthreads.com/vgpu": st.just(1),
            "mthreads.com/sgpu-memory": st.sampled_from([2, 8, 32]),
            "mthreads.com/sgpu-core": st.integers(1, 16),
        }
    ),
    st.fixed_dictionaries(
        {"amd.com/gpu": st.just(1), "amd.com/gpumem": st.integers(1, 40000), "amd.com/gpucores": st.integers(1, 100)}
    ),
    st.fixed_dictionaries({"enflame.com/drs-gcu": st.integers(1, 3)}),
    st.fixed_dictionaries({"enflame.com/gcu": st.integers(1, 2)}),
    st.fixed_dictionaries({"kunlunxin.com/xpu": st.integers(1, 3)}),
    st.one_of(
        st.fixed_dictionaries({"aws.amazon.com/neuron": st.integers(1, 2)}),
        st.fixed_dictionaries({"aws.amazon.com/neuroncore": st.sampled_from([1, 2])}),
    ),
    st.fixed_dictionaries({"metax-tech.com/gpu": st.integers(1, 2)}),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(LIMITS, min_size=1, max_size=25))
def test_no_device_is_ever_over_capacity(requests):
    ledger, warnings = rebuild(_cluster(), [], CFG.vendors)
    assert not warnings
    for i, limits in enumerate(requests):
        try:
            p = admit(pod(f"p{i}", [ctr(limits=limits)]), CFG)
        except RequestError:
            continue
        r = schedule_pod(p, None, ledger, CFG, NOW)
        if r.node is not None:
            want = {VENDOR_OF[k] for k in limits if k in VENDOR_OF}
            assert set(r.allocation.devices) == want
    for name in ledger.node_names():
        for d, used, usedmem, usedcores in ledger.device_usage(name):
            assert used <= d.count and usedmem <= d.devmem and usedcores <= d.devcore, (
                name,
                d.id,
                used,
                usedmem,
                usedcores,
            )


@pytest.mark.parametrize(
    "case, node_annotations, capacity, limits, pod_annotations, expected",
    [
        (
            "MetaX GPU cordon",
            {"hami.io/device-cordon": "n1-metax-gpu-0"},
            {"metax-tech.com/gpu": 1},
            {"metax-tech.com/gpu": 1},
            {},
            {"n1": "1/1 CardCordoned"},
        ),
        (
            "Enflame GCU cordon",
            {"hami.io/device-cordon": "n1-enflame-gcu-0"},
            {"enflame.com/gcu": 1},
            {"enflame.com/gcu": 1},
            {},
            {"n1": "1/1 CardCordoned"},
        ),
        (
            "AWS Neuron cordon",
            {"hami.io/device-cordon": "n1-awsneuron-0"},
            {"aws.amazon.com/neuron": 1, "aws.amazon.com/neuroncore": 2},
            {"aws.amazon.com/neuron": 1},
            {},
            {"n1": "1/1 CardCordoned"},
        ),
        (
            "AWS Neuron nouse",
            {},
            {"aws.amazon.com/neuron": 1, "aws.amazon.com/neuroncore": 2},
            {"aws.amazon.com/neuron": 1},
            {"aws.amazon.com/nouse-neuron-uuid": "n1-awsneuron-0"},
            {"n1": "1/1 CardUuidMismatch"},
        ),
        (
            "AWS Neuron use",
            {},
            {"aws.amazon.com/neuron": 2, "aws.amazon.com/neuroncore": 4},
            {"aws.amazon.com/neuron": 1},
            {"aws.amazon.com/use-neuron-uuid": "n1-awsneuron-1"},
            "n1-AWSNeuron-1",
        ),
    ],
)
def test_device_ids_our_earlier_releases_spelled_still_name_their_devices(
    case, node_annotations, capacity, limits, pod_annotations, expected
):
    """MetaX GPU, Enflame GCU and AWS Neuron devices took HAMi's ID spelling; a cordon list or a
    use/nouse annotation written with the old spelling named no device after the upgrade (a
    cordoned card took pods, an excluded device was given, an asked-for one never was)."""
    from ._vendorkit import config, ctr, node, one, pod

    r = one(
        [node("n1", node_annotations, capacity=capacity)], pod("p", [ctr(limits=limits)], pod_annotations), config()
    )
    if isinstance(expected, dict):
        assert r.node is None and r.reasons() == expected, case
    else:
        assert r.node == "n1" and any(
            v.startswith(expected + ",") for k, v in r.annotations.items() if k.endswith("-allocated")
        ), (case, r.annotations)
