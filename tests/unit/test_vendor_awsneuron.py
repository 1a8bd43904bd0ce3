"""AWS Neuron: whole devices or single NeuronCores, from node capacity.

Formats as HAMi's ``pkg/device/awsneuron`` writes them: device IDs ``<node>-AWSNeuron-<i>``,
``devcore`` and every grant's cores are NeuronCore bitmasks (bit n = core n of the device),
``AWS_NEURON_IDS`` lists the set bits as ``index x cores + n`` for core requests (device indexes
for ``aws.amazon.com/neuron``), ``NEURON_ALLOC_TIME`` is unix nanoseconds."""

from __future__ import annotations

import re

import pytest

from hami.core import decode_pod_devices, rebuild, schedule_pod
from hami.core.errors import RequestError

from ._vendorkit import NOW, admit, config, ctr, node, one, place, pod, running

CFG = config()
DEV, CORE = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"
ALLOCATED = "hami.io/aws-neuron-devices-allocated"
NEURON = next(v for v in CFG.vendors if v.name == "AWSNeuron")


def inf_node(name: str = "inf", devices: int = 2, cores: int = 2) -> dict:
    n = node(name, capacity={DEV: devices, CORE: cores * devices})
    n["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "inf2.48xlarge"  # (any run of devices)
    return n


def core_pod(name: str) -> dict:
    return pod(name, [ctr(limits={CORE: 1})])


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
    "cores,mask",
    [(1, 0b1), (2, 0b11), (4, 0b1111), (8, 0b1111)],  # HAMi addresses at most 4 cores of a device
)
def test_devices_as_hami_registers_them(cores, mask):
    devices = NEURON.node_devices(inf_node("n1", devices=2, cores=cores))
    assert [(d.id, d.index, d.count, d.devcore, d.devmem, d.type) for d in devices] == [
        ("n1-AWSNeuron-0", 0, cores, mask, 0, "AWSNeuron"),
        ("n1-AWSNeuron-1", 1, cores, mask, 0, "AWSNeuron"),
    ]


@pytest.mark.parametrize(
    "limits,allocated,ids,kind",
    [
        ({DEV: 1}, "inf-AWSNeuron-0,AWSNeuron,0,3:;", "0", None),  # device IDs: no resource type (HAMi)
        ({CORE: 4}, "inf-AWSNeuron-0,AWSNeuron,0,3:inf-AWSNeuron-1,AWSNeuron,0,3:;", "0,1,2,3", CORE),
        ({CORE: 1}, "inf-AWSNeuron-0,AWSNeuron,0,1:;", "0", CORE),
    ],
)
def test_annotations_exact(limits, allocated, ids, kind):
    r = one([inf_node()], pod("p", [ctr(limits=limits)]))
    assert r.annotations == {
        "hami.io/vgpu-node": "inf",
        "hami.io/vgpu-time": str(int(NOW)),
        ALLOCATED: allocated,
        "AWS_NEURON_IDS": ids,
        "NEURON_ALLOC_TIME": str(int(NOW) * 1_000_000_000),  # unix nanoseconds, as HAMi
        "NEURON_ALLOCATED": "false",
        **({"NEURON_RESOURCE_TYPE": kind} if kind else {}),
        "aws.amazon.com/predicate-node": "inf",
    }


def test_second_core_of_a_device():
    pods = [
        pod("a", [ctr(limits={CORE: 1})]),
        pod("b", [ctr(limits={CORE: 1})], {"hami.io/gpu-scheduler-policy": "binpack"}),
    ]
    results = place([inf_node()], pods)
    assert results[1].annotations[ALLOCATED] == "inf-AWSNeuron-0,AWSNeuron,0,2:;"  # bit 1 = core 1
    assert results[1].annotations["AWS_NEURON_IDS"] == "1"


def test_a_freed_core_is_handed_out_not_a_held_one():
    """Pods a (core 0) and b (core 1); a ends and the scheduler rebuilds from b alone: the next pod
    gets core 0, the free one (it got core 1 again when grants counted cores instead of naming them)."""
    n = inf_node(devices=1)
    a, b = core_pod("a"), core_pod("b")
    ra, rb = place([n], [a, b])
    assert (ra.annotations["AWS_NEURON_IDS"], rb.annotations["AWS_NEURON_IDS"]) == ("0", "1")
    rc = place([n], [core_pod("c")], placed=[running(b, "inf", rb.annotations)])[0]
    assert rc.annotations[ALLOCATED] == "inf-AWSNeuron-0,AWSNeuron,0,1:;"
    assert rc.annotations["AWS_NEURON_IDS"] == "0"
    r3 = place([n], [core_pod("d")], placed=[running(b, "inf", rb.annotations), running(a, "inf", rc.annotations)])[0]
    assert r3.reasons() == {"inf": "1/1 CardTimeSlicingExhausted"}


@pytest.mark.parametrize(
    "held,limits,expected",
    [
        # HAMi's spelling and masks: a whole device (mask 3) leaves nothing
        ("n1-AWSNeuron-0,AWSNeuron,0,3:;", {DEV: 1}, None),
        ("n1-AWSNeuron-0,AWSNeuron,0,3:;", {CORE: 1}, None),
        # core 1 held (mask 2): the next core request gets core 0 (mask 1)
        ("n1-AWSNeuron-0,AWSNeuron,0,2:;", {CORE: 1}, ("n1-AWSNeuron-0,AWSNeuron,0,1:;", "0")),
    ],
)
def test_a_pod_hami_placed_is_counted(held, limits, expected):
    n = inf_node("n1", devices=1)
    placed = running(pod("old", [ctr(limits=limits)]), "n1", {ALLOCATED: held})
    r = place([n], [pod("new", [ctr(limits=limits)])], placed=[placed])[0]
    got = (r.annotations[ALLOCATED], r.annotations["AWS_NEURON_IDS"]) if r.node else None
    assert got == expected


@pytest.mark.parametrize(
    "text,annotations,expected",
    [
        # our earlier releases: whole devices recorded their core count, single cores 1 (named only
        # in AWS_NEURON_IDS, which the pod's owner may edit: not trusted, the core is "unknown")
        ("inf-awsneuron-1,AWSNeuron,0,2:;", {}, "inf-AWSNeuron-1,AWSNeuron,0,3:;"),
        ("inf-awsneuron-0,AWSNeuron,0,4:;", {}, "inf-AWSNeuron-0,AWSNeuron,0,15:;"),
        (
            "inf-awsneuron-0,AWSNeuron,0,1:;",
            {"AWS_NEURON_IDS": "1", "NEURON_RESOURCE_TYPE": "neuroncore"},
            "inf-AWSNeuron-0,AWSNeuron,0,16:;",
        ),
        (
            "inf-awsneuron-0,AWSNeuron,0,1:;inf-awsneuron-0,AWSNeuron,0,1:;",
            {"AWS_NEURON_IDS": "0,1", "NEURON_RESOURCE_TYPE": "neuroncore"},
            "inf-AWSNeuron-0,AWSNeuron,0,16:;inf-AWSNeuron-0,AWSNeuron,0,16:;",
        ),
        # HAMi's spelling is read as it is
        ("inf-AWSNeuron-0,AWSNeuron,0,2:;", {"AWS_NEURON_IDS": "1"}, "inf-AWSNeuron-0,AWSNeuron,0,2:;"),
    ],
)
def test_legacy_allocations_read_as_hami_writes_them(text, annotations, expected):
    got = NEURON.read_allocation(decode_pod_devices(text), {ALLOCATED: text, **annotations})
    assert [[(cd.uuid, cd.usedcores) for cd in c] for c in got] == [
        [(cd.uuid, cd.usedcores) for cd in c] for c in decode_pod_devices(expected)
    ]


def test_pods_our_earlier_releases_placed_still_count():
    """After an upgrade from our previous release, its pods (IDs ``<node>-awsneuron-<i>``, cores
    counted) hold the same devices: no double booking. A single core's position was only in
    AWS_NEURON_IDS, which its owner may edit (editing it made a new pod land on the old pod's
    core): its device takes no new core until the old pod ends; the other devices do."""
    n = inf_node("n1", devices=3)
    whole = running(pod("w", [ctr(limits={DEV: 1})]), "n1", {ALLOCATED: "n1-awsneuron-1,AWSNeuron,0,2:;"})
    core1 = running(
        core_pod("c1"),
        "n1",
        {ALLOCATED: "n1-awsneuron-0,AWSNeuron,0,1:;", "AWS_NEURON_IDS": "0", "NEURON_RESOURCE_TYPE": "neuroncore"},
    )
    ledger, warnings = rebuild([n], [whole, core1], CFG.vendors)
    assert not warnings
    usage = {d.id: (used, cores) for d, used, _, cores in ledger.device_usage("n1")}
    assert usage == {"n1-AWSNeuron-0": (1, 0b10000), "n1-AWSNeuron-1": (1, 0b11), "n1-AWSNeuron-2": (0, 0)}
    assert ledger.namespace_usage("default", "AWSNeuron") == (0, 3)  # the unknown core counts as one
    r = schedule_pod(admit(core_pod("new"), CFG), None, ledger, CFG, NOW)
    assert (r.annotations[ALLOCATED], r.annotations["AWS_NEURON_IDS"]) == ("n1-AWSNeuron-2,AWSNeuron,0,1:;", "4")
    r = schedule_pod(admit(core_pod("more"), CFG), None, ledger, CFG, NOW)
    assert r.annotations[ALLOCATED] == "n1-AWSNeuron-2,AWSNeuron,0,2:;"
    r = schedule_pod(admit(core_pod("full"), CFG), None, ledger, CFG, NOW)
    assert r.node is None


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


def test_a_namespace_quota_counts_the_cores_a_mask_names_not_the_mask():
    """A grant records its cores as a bit mask (core 1 = 2, a whole 2-core device = 3); a
    namespace's core usage summed the masks, so the pod on core 1 counted 2 cores."""
    n = inf_node(devices=2)
    a, b = core_pod("a"), core_pod("b")
    ra, rb = place([n], [a, b])
    assert (ra.annotations["AWS_NEURON_IDS"], rb.annotations["AWS_NEURON_IDS"]) == ("0", "1")
    placed = [running(a, "inf", ra.annotations), running(b, "inf", rb.annotations)]
    ledger, warnings = rebuild([n], placed, CFG.vendors)
    assert not warnings
    assert ledger.namespace_usage("default", "AWSNeuron") == (0, 2)  # two cores, masks 1 and 2


def test_a_namespace_quota_on_cores_refuses_the_pod_that_would_pass_it():
    """A Neuron request counted 0 cores in the quota probe, so limits.aws.amazon.com/neuroncore: 1
    let a second single-core pod past it (found by the final review)."""
    quota = {
        "metadata": {"name": "q", "namespace": "default"},
        "spec": {"hard": {"limits.aws.amazon.com/neuroncore": "1"}},
    }
    ledger, warnings = rebuild([inf_node(devices=2)], [], CFG.vendors, [quota])
    assert not warnings
    first = schedule_pod(admit(core_pod("a"), CFG), None, ledger, CFG, NOW)
    assert first.node == "inf"
    second = schedule_pod(admit(core_pod("b"), CFG), None, ledger, CFG, NOW)
    assert second.node is None and "ResourceQuotaNotFit" in str(second.reasons()), second.reasons()


def core_quota(limit: int) -> dict:
    return {
        "metadata": {"name": "q", "namespace": "default"},
        "spec": {"hard": {"limits.aws.amazon.com/neuroncore": str(limit)}},
    }


@pytest.mark.parametrize(
    "limit,fits",
    [
        (3, False),  # a whole 4-core device takes 4 cores: over a quota of 3 ...
        (4, True),  # ... within one of 4
    ],
)
def test_a_whole_device_charges_the_quota_the_cores_the_node_has(limit, fits):
    """A whole device asked ``awsneuron.coresPerDevice`` (2) of the quota whatever the node's
    devices have, while the grant's mask (4 cores on an Inf1 node) counted 4 once placed: a pod
    passed a quota of 3 and the namespace then held 4."""
    ledger, warnings = rebuild([inf_node(devices=2, cores=4)], [], CFG.vendors, [core_quota(limit)])
    assert not warnings
    r = schedule_pod(admit(pod("w", [ctr(limits={DEV: 1})]), CFG), None, ledger, CFG, NOW)
    if fits:
        assert r.annotations[ALLOCATED] == "inf-AWSNeuron-0,AWSNeuron,0,15:;"
        assert ledger.namespace_usage("default", "AWSNeuron") == (0, 4)
        more = schedule_pod(admit(core_pod("c"), CFG), None, ledger, CFG, NOW)  # the quota is spent
        assert more.node is None and "ResourceQuotaNotFit" in str(more.reasons()), more.reasons()
    else:
        assert r.node is None and r.reasons() == {"inf": "2/2 ResourceQuotaNotFit"}, r.reasons()
        assert ledger.namespace_usage("default", "AWSNeuron") == (0, 0)


@pytest.mark.parametrize("cores", [2, 4])
def test_a_pods_earlier_containers_charge_the_quota_their_cores_not_their_masks(cores):
    """Two containers each asking a whole device, under a quota of exactly their cores: the
    first container's pick counted its mask (3 for a 2-core device, 15 for 4 cores) beside the
    second's ``coresPerDevice``, so the pod was refused a quota it fits."""
    n = inf_node(devices=2, cores=cores)
    ledger, warnings = rebuild([n], [], CFG.vendors, [core_quota(2 * cores)])
    assert not warnings
    p = pod("two", [ctr("a", limits={DEV: 1}), ctr("b", limits={DEV: 1})])
    r = schedule_pod(admit(p, CFG), None, ledger, CFG, NOW)
    assert r.node == "inf", r.reasons()
    assert ledger.namespace_usage("default", "AWSNeuron") == (0, 2 * cores)


def test_single_cores_of_one_pod_charge_one_core_each():
    """Two single-core containers on one device charge 2 cores (masks 1 and 2), not 3."""
    ledger, warnings = rebuild([inf_node(devices=1)], [], CFG.vendors, [core_quota(2)])
    assert not warnings
    p = pod("two", [ctr("a", limits={CORE: 1}), ctr("b", limits={CORE: 1})])
    r = schedule_pod(admit(p, CFG), None, ledger, CFG, NOW)
    assert r.annotations[ALLOCATED] == "inf-AWSNeuron-0,AWSNeuron,0,1:;inf-AWSNeuron-0,AWSNeuron,0,2:;", r.reasons()
    assert ledger.namespace_usage("default", "AWSNeuron") == (0, 2)
