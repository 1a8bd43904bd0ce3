import json

import pytest

from hami.core import (
    CodecError,
    ContainerDevice,
    DeviceInfo,
    decode_node_devices_json,
    decode_node_devices_legacy,
    decode_pod_devices,
    encode_node_devices_json,
    encode_node_devices_legacy,
    encode_pod_devices,
)

HAMI_JSON = (
    '[{"id":"GPU-0055a1b2","count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB",'
    '"mode":"hami-core","health":true},{"id":"GPU-0055a1b3","index":1,"count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core","health":true}]'
)


def test_json_registration_round_trips_byte_for_byte():
    devices = decode_node_devices_json(HAMI_JSON, "NVIDIA")
    assert [d.index for d in devices] == [0, 1]
    assert devices[1].numa == 1 and devices[0].numa == 0
    assert all(d.vendor == "NVIDIA" for d in devices)
    assert encode_node_devices_json(devices) == HAMI_JSON


def test_json_missing_health_means_unhealthy():
    (dev,) = decode_node_devices_json('[{"id":"GPU-x","count":10,"devmem":1000,"devcore":100,"type":"NVIDIA-T4"}]')
    assert dev.health is False and dev.index == 0 and dev.mode == ""


def test_json_custominfo_and_mig_profiles_are_read():
    text = (
        '[{"id":"GPU-a","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100","mode":"mig","health":true,'
        '"migProfiles":[{"name":"2g.10gb","memoryMB":9984,"core":29,"sliceCount":2,'
        '"placements":[{"start":0,"size":2}]}],"custominfo":{"NetworkID":3}}]'
    )
    (dev,) = decode_node_devices_json(text)
    assert dev.mig_profiles[0].name == "2g.10gb" and dev.mig_profiles[0].placements == ((0, 2),)
    assert dev.custominfo == {"NetworkID": 3}


@pytest.mark.parametrize(
    "text,needle",
    [
        ("not json", "not valid JSON"),
        ('{"id":"x"}', "JSON array"),
        ('[{"id":"GPU-a","devmem":"lots"}]', "'devmem'"),
        ('[{"id":"GPU-a","health":"yes"}]', "'health'"),
        ('[{"count":1}]', "'id'"),
        ('[{"id":"GPU-a","count":-1}]', "'count'"),
    ],
)
def test_json_errors_name_the_field(text, needle):
    with pytest.raises(CodecError, match=needle):
        decode_node_devices_json(text)


def test_go_html_escaping_is_reproduced():
    dev = DeviceInfo(id="GPU-a", count=1, devmem=1, devcore=100, type="A<B>&C", health=True)
    assert '"type":"A\\u003cB\\u003e\\u0026C"' in encode_node_devices_json([dev])
    assert decode_node_devices_json(encode_node_devices_json([dev]))[0].type == "A<B>&C"


LEGACY9 = "GPU-0055,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,0,hami-core:GPU-0056,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,1,false,1,hami-core:"


def test_legacy_nine_fields_round_trip():
    devices = decode_node_devices_legacy(LEGACY9)
    assert [(d.id, d.index, d.numa, d.health) for d in devices] == [("GPU-0055", 0, 0, True), ("GPU-0056", 1, 1, False)]
    assert encode_node_devices_legacy(devices) == LEGACY9


def test_legacy_numa_may_be_negative_like_the_json_form():
    (dev,) = decode_node_devices_legacy("DCU-1,4,16384,100,DCU-Z100,-1,true:")
    assert dev.numa == -1


def test_legacy_seven_fields_default_mode_and_go_bools():
    (dev,) = decode_node_devices_legacy("DCU-1,4,16384,100,DCU-Z100,0,t:")
    assert dev.mode == "hami-core" and dev.index == 0 and dev.health is True


@pytest.mark.parametrize(
    "text,needle",
    [
        ("GPU-1,10,1,100,T4,0,true", "no ':'"),
        ("GPU-1,10,1,100,T4,0,true,0:", "7 or 9"),
        ("GPU-1,ten,1,100,T4,0,true:", "'count'"),
        ("GPU-1,10,1,100,T4,0,maybe:", "'health'"),
        ("GPU-1,-10,1,100,T4,0,true:", "'count' must not be negative, got '-10'"),
        ("GPU-1,10,-1,100,T4,0,true:", "'devmem' must not be negative"),
        ("GPU-1,10,1,-100,T4,0,true:", "'devcore' must not be negative"),
        ("GPU-1,10,1,100,T4,0,true,-2,hami-core:", "'index' must not be negative"),
        ("GPU-1,2147483648,1,100,T4,0,true:", "'count' must be in 0..2147483647"),  # beyond int32
        ("GPU-1,\u0661\u0660,1,100,T4,0,true:", "'count'"),  # Arabic-Indic digits int() would take
        ("GPU-1,1_0,1,100,T4,0,true:", "'count'"),
        ("GPU-1, 10,1,100,T4,0,true:", "'count'"),
        ("GPU-1,99999999999999999999,1,100,T4,0,true:", "'count'"),  # beyond int64
        ("GPU-1,10,1,100,T4,x,true:", "'numa' must be an integer"),
        (",10,1,100,T4,0,true:", "'id' is empty"),
    ],
)
def test_legacy_errors(text, needle):
    with pytest.raises(CodecError, match=needle):
        decode_node_devices_legacy(text)


@pytest.mark.parametrize(
    "text",
    [
        "GPU-0fc3,NVIDIA,3000,0:;GPU-0fc3,NVIDIA,5000,0:;",
        ";GPU-aa,NVIDIA,2000,30:;",
        "GPU-a,NVIDIA,1000,10:GPU-b,NVIDIA,1000,10:;;",
        ";;",
        "",
    ],
)
def test_pod_allocation_round_trips_literal_hami_strings(text):
    assert encode_pod_devices(decode_pod_devices(text)) == text


def test_pod_allocation_keeps_empty_containers_for_alignment():
    decoded = decode_pod_devices(";GPU-aa,NVIDIA,2000,30:;")
    assert decoded == ((), (ContainerDevice("GPU-aa", "NVIDIA", 2000, 30),))


def test_pod_allocation_with_missing_fields_is_an_error():
    with pytest.raises(CodecError, match="nodeName"):
        decode_pod_devices("GPU-aa,NVIDIA,2000:;")
    with pytest.raises(CodecError, match="usedmem"):
        decode_pod_devices("GPU-aa,NVIDIA,x,1:;")


def test_registration_json_is_a_json_array():
    assert json.loads(encode_node_devices_json([])) == []


def test_nvidia_registration_accepts_the_legacy_colon_form_too():
    from hami.vendors import NvidiaVendor

    v = NvidiaVendor()
    node = {"metadata": {"name": "n", "annotations": {v.register_annotation: LEGACY9}}}
    assert [d.id for d in v.node_devices(node)] == ["GPU-0055", "GPU-0056"]
    node["metadata"]["annotations"][v.register_annotation] = "garbage"
    with pytest.raises(CodecError, match="hami.io/node-nvidia-register: neither a JSON device list nor the legacy"):
        v.node_devices(node)
    node["metadata"]["annotations"][v.register_annotation] = "[{oops"
    with pytest.raises(CodecError, match="not valid JSON"):
        v.node_devices(node)


def test_pod_devices_decode_is_cached_by_text_and_refuses_bad_text_every_time():
    """A watched pod's allocation text comes back unchanged on each of its events: decoded once."""
    text = "GPU-a,NVIDIA,4000,5:;GPU-b,NVIDIA,2000,0:;"
    first = decode_pod_devices(text)
    assert decode_pod_devices(str(text)) is first  # an equal string: the cached result, not a new one
    assert decode_pod_devices(text + "GPU-c,NVIDIA,1,1:;") is not first
    for _ in range(2):  # an error is not cached: raised each time
        with pytest.raises(CodecError):
            decode_pod_devices("GPU-a,NVIDIA,lots,5:;")
