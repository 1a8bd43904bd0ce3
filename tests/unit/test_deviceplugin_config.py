"""Kubelet IDs and the registration annotation (node settings: test_node_settings.py)."""

import json
from datetime import datetime

from hami.core.codec import decode_node_devices_json, encode_node_devices_json
from hami.deviceplugin.devices import DeviceState, physical_id, plugin_ids
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings
from hami.deviceplugin.register import HANDSHAKE, REGISTER, registration_patch

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def test_kubelet_ids_and_physical_ids():
    ids = plugin_ids(U0, 3)
    assert ids == [f"{U0}-0", f"{U0}-1", f"{U0}-2"]
    assert {physical_id(i) for i in ids} == {U0} and physical_id(U0) == U0 and physical_id(f"{U0}::2") == U0


GPUS = [
    PhysicalGPU(0, U0, "Tesla T4", 15360, "0000:3b:00.0", 1),
    PhysicalGPU(1, "GPU-bbbbbbbb-0000-0000-0000-000000000000", "NVIDIA A100", 40960, "0000:5e:00.0", 0),
]


async def test_registration_content_and_health():
    s = NodeSettings(
        device_split_count=4, device_memory_scaling=2.0, device_core_scaling=1.5, enable_numa_topology=True
    )
    state = DeviceState(GPUS, s)
    devs = decode_node_devices_json(encode_node_devices_json(state.registration()))
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.numa, d.mode, d.health) for d in devs] == [
        (U0, 0, 4, 30720, 150, "NVIDIA-Tesla T4", 1, "hami-core", True),
        (GPUS[1].uuid, 1, 4, 81920, 150, "NVIDIA A100", 0, "hami-core", True),
    ]
    assert len(state.kubelet_devices()) == 8 and state.kubelet_devices()[0] == (f"{U0}-0", True, 1)
    v = state.version
    await state.mark_unhealthy([U0, "GPU-unknown"])
    assert state.version == v + 1 and not state.healthy(U0)
    await state.mark_unhealthy([U0])  # no change, no wake-up
    assert state.version == v + 1
    assert all(not h for i, h, _ in state.kubelet_devices() if i.startswith(U0))


def test_registration_patch_only_when_changed():
    from hami.kube.nodelock import LOCK_HANDOFF

    state = DeviceState(GPUS, NodeSettings())
    now = datetime(2026, 1, 2, 3, 4, 5)
    first = registration_patch(state, {}, now)
    assert set(first) == {REGISTER, HANDSHAKE, LOCK_HANDOFF} and first[HANDSHAKE] == "Reported 2026-01-02 03:04:05"
    assert first[LOCK_HANDOFF] == "swap"
    written = {REGISTER: first[REGISTER], LOCK_HANDOFF: "swap"}
    assert registration_patch(state, {**written, HANDSHAKE: "Requesting_2026-01-02 03:04:00"}, now) is None
    stale = registration_patch(state, {**written, HANDSHAKE: "Deleted_2026-01-01 00:00:00"}, now)
    assert stale == {HANDSHAKE: "Reported 2026-01-02 03:04:05"}
    # --lock-release-delay=0: the declaration is withdrawn (and never written)
    assert registration_patch(state, {**written, HANDSHAKE: "Reported x"}, now, handoff=False) == {LOCK_HANDOFF: None}
    assert LOCK_HANDOFF not in registration_patch(state, {}, now, handoff=False)


def test_registration_patch_writes_the_scores_when_they_change():
    from hami.deviceplugin.register import SCORE

    now = datetime(2026, 1, 2, 3, 4, 5)
    state = DeviceState(GPUS, NodeSettings(), {GPUS[0].uuid: {GPUS[1].uuid: 250}, GPUS[1].uuid: {GPUS[0].uuid: 250}})
    first = registration_patch(state, {}, now)
    assert json.loads(first[SCORE]) == [
        {"uuid": GPUS[0].uuid, "score": {GPUS[1].uuid: 250}},
        {"uuid": GPUS[1].uuid, "score": {GPUS[0].uuid: 250}},
    ]
    written = {k: v for k, v in first.items() if v is not None}
    assert registration_patch(state, written, now) is None
    assert SCORE not in (registration_patch(DeviceState(GPUS, NodeSettings()), {}, now) or {})
