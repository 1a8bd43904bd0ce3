from hami.core import Ledger, encode_node_devices_json, rebuild

from ._corekit import CONFIG, gpu, node, pod


def node_obj(name, n=2, **annotations):
    ann = {"hami.io/node-nvidia-register": encode_node_devices_json([gpu(name, i) for i in range(n)]), **annotations}
    return {"metadata": {"name": name, "annotations": ann}}


def placed(name, node_name, value, ns="default", **extra):
    p = pod(name, ns=ns, admit=False)
    p["metadata"]["annotations"] = {"hami.io/vgpu-node": node_name, "hami.io/vgpu-devices-allocated": value}
    p.update(extra)
    return p


def test_rebuild_from_objects_with_warnings():
    nodes = [
        node_obj("a"),
        node_obj("b", **{"hami.io/device-cordon": "GPU-b-1"}),
        {"metadata": {"name": "bad", "annotations": {"hami.io/node-nvidia-register": "[{"}}},
    ]
    pods = [
        placed("p1", "a", "GPU-a-0,NVIDIA,3000,30:;"),
        placed("p2", "a", "GPU-a-0,NVIDIA,1000,10:;"),
        placed("broken", "a", "GPU-a-0,NVIDIA:;"),
        placed("done", "a", "GPU-a-1,NVIDIA,1000,10:;", status={"phase": "Succeeded"}),
    ]
    quotas = [{"metadata": {"name": "q", "namespace": "default"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "x"}}}]
    led, warnings = rebuild(nodes, pods, CONFIG.vendors, quotas)
    assert led.node_names() == ["a", "b"]
    assert led.node("b").cordoned == frozenset({"GPU-b-1"})
    assert [u[1:] for u in led.device_usage("a")] == [(2, 4000, 40), (0, 0, 0)]
    assert len(warnings) == 3
    assert "skipping node: node bad: annotation hami.io/node-nvidia-register" in warnings[0]
    assert "pod default/broken: annotation hami.io/vgpu-devices-allocated" in warnings[1]
    assert "ResourceQuota default/q spec.hard.limits.nvidia.com/gpumem" in warnings[2]
    assert led.namespace_usage("default", "NVIDIA") == (4000, 40)


def test_pods_seen_before_their_node_count_once_it_registers():
    from hami.core import allocation_from_pod, node_devices_from_object

    led = Ledger()
    led.add_pod(allocation_from_pod(placed("p", "late", "GPU-late-1,NVIDIA,500,5:;"), CONFIG.vendors))
    led.set_node(node_devices_from_object(node_obj("late"), CONFIG.vendors))
    assert [u[1:] for u in led.device_usage("late")] == [(0, 0, 0), (1, 500, 5)]
    led.remove_node("late")
    assert led.node_names() == []
    led.set_node(node("late", n=2))
    assert [u[1:] for u in led.device_usage("late")][1] == (1, 500, 5)


def test_summary_tracks_free_capacity():
    led = Ledger()
    led.set_node(node("n", n=2, mem=1000, count=2))
    from hami.core import allocation_from_pod

    led.add_pod(allocation_from_pod(placed("p", "n", "GPU-n-0,NVIDIA,1000,100:;"), CONFIG.vendors))
    led.add_pod(allocation_from_pod(placed("q", "n", "GPU-n-0,NVIDIA,0,0:;"), CONFIG.vendors))
    s = led.summary("n").vendors["NVIDIA"]
    assert (s.devices, s.free_slot, s.idle, s.max_free_mem, s.max_free_cores) == (2, 1, 1, 1000, 100)
    led.remove_pod("uid-default-q")
    assert led.summary("n").vendors["NVIDIA"].free_slot == 2
    # GPU 1's two slots taken with no memory or cores: its free 1000 MiB and 100 cores are out of
    # reach, so the summary's best device is GPU 0 (one slot left, nothing else)
    led.add_pod(allocation_from_pod(placed("r", "n", "GPU-n-1,NVIDIA,0,0:;"), CONFIG.vendors))
    led.add_pod(allocation_from_pod(placed("t", "n", "GPU-n-1,NVIDIA,0,0:;"), CONFIG.vendors))
    s = led.summary("n").vendors["NVIDIA"]
    assert (s.free_slot, s.max_free_mem, s.max_free_cores, s.max_pct_bound) == (1, 0, 0, 0.1)


def test_confirm_ends_a_reservation_without_recounting_and_refuses_a_different_one():
    from dataclasses import replace

    from hami.core import allocation_from_pod, node_devices_from_object

    led = Ledger()
    led.set_node(node_devices_from_object(node_obj("a"), CONFIG.vendors))
    decided = allocation_from_pod(placed("p", "a", "GPU-a-0,NVIDIA,3000,30:;"), CONFIG.vendors)
    written = allocation_from_pod(placed("p", "a", "GPU-a-0,NVIDIA,3000,30:;"), CONFIG.vendors)
    assert written is not decided
    led.reserve(decided)
    before = [u[1:] for u in led.device_usage("a")]
    assert led.confirm(written)
    assert not led.is_reserved(written.key) and led.pod(written.key) is written
    assert [u[1:] for u in led.device_usage("a")] == before == [(1, 3000, 30), (0, 0, 0)]
    assert led.namespace_usage("default", "NVIDIA") == (3000, 30)
    assert not led.confirm(written)  # no reservation left to end
    # a written allocation that counts otherwise is not a confirmation: nothing changes
    led.reserve(decided)
    other = allocation_from_pod(placed("p", "a", "GPU-a-1,NVIDIA,3000,30:;"), CONFIG.vendors)
    for different in (other, replace(decided, node="b"), replace(decided, namespace="x")):
        assert not led.confirm(different)
        assert led.is_reserved(decided.key) and led.pod(decided.key) is decided
    assert [u[1:] for u in led.device_usage("a")] == [(1, 3000, 30), (0, 0, 0)]
    # removing a confirmed pod gives everything back
    assert led.confirm(written)
    led.remove_pod(written.key)
    assert [u[1:] for u in led.device_usage("a")] == [(0, 0, 0), (0, 0, 0)]
    assert led.namespace_usage("default", "NVIDIA") == (0, 0)


def test_rebuild_skips_only_the_vendor_whose_registration_is_unreadable():
    from hami.config import chart_device_config
    from hami.vendors import build_vendors

    vendors = build_vendors(chart_device_config())
    broken = '[{"id":"npu-0","count":4,"devmem":65536.0,"devcore":20,"type":"Ascend910B3"}]'
    mixed = node_obj("mixed", **{"hami.io/node-register-Ascend910B3": broken})
    only_npu = {"metadata": {"name": "npu", "annotations": {"hami.io/node-register-Ascend910B3": broken}}}
    led, warnings = rebuild([mixed, only_npu], [placed("p", "mixed", "GPU-mixed-1,NVIDIA,500,5:;")], vendors)
    assert led.node_names() == ["mixed"]  # the node of the broken vendor alone has nothing left
    assert [d.id for d in led.node("mixed").devices] == ["GPU-mixed-0", "GPU-mixed-1"]
    assert [u[1:] for u in led.device_usage("mixed")] == [(0, 0, 0), (1, 500, 5)]
    assert len(warnings) == 2
    assert warnings[0].startswith("skipping the Ascend910B3 devices: node mixed: annotation hami.io/node-register-")
    assert warnings[1].startswith("skipping node: node npu: annotation hami.io/node-register-Ascend910B3")
