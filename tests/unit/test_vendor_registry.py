"""The vendor table: every section builds its backends, keys never collide, config errors name the field."""

from __future__ import annotations

import pytest

from hami.config import chart_device_config, load_device_config
from hami.core.errors import ConfigError
from hami.vendors import build_vendors

ALL = build_vendors(chart_device_config())


def test_every_backend_is_built_from_the_chart_config():
    assert [v.name for v in ALL] == [
        "NVIDIA",
        "Ascend910A",
        "Ascend910B2",
        "Ascend910B3",
        "Ascend910B4-1",
        "Ascend910B4",
        "Ascend310P",
        "Ascend910C",
        "MLU",
        "DCU",
        "MR-V100",
        "MR-V50",
        "BI-V150",
        "BI-V100",
        "Metax-GPU",
        "Metax-SGPU",
        "Mthreads",
        "Enflame",
        "GCU",
        "kunlun",
        "XPU",
        "AMD",
        "AWSNeuron",
        "Vastai",
        "Biren",
    ]


@pytest.mark.parametrize("attr", ["allocated_annotation", "register_annotation", "to_allocate_annotation"])
def test_annotation_keys_are_unique(attr):
    keys = [getattr(v, attr) for v in ALL if getattr(v, attr)]
    assert len(keys) == len(set(keys))


def test_count_resources_are_unique():
    names = [v.resources.count for v in ALL]
    assert len(names) == len(set(names))


def test_sections_enable_vendors():
    cfg = load_device_config("""
cambricon:
  resourceCountName: cambricon.com/mlu
vnpus:
  configs:
  - commonWord: Ascend910B3
    resourceName: huawei.com/Ascend910B3
    resourceMemoryName: huawei.com/Ascend910B3-memory
    memoryAllocatable: 65536
    memoryCapacity: 65536
    templates: [{name: vir05_1c_16g, memory: 16384}]
""")
    vendors = build_vendors(cfg)
    assert [v.name for v in vendors] == ["Ascend910B3", "MLU"]
    assert vendors[1].resources.count == "cambricon.com/mlu"


@pytest.mark.parametrize(
    "text,message",
    [
        ("iluvatars:\n- chipName: BI-V100\n", "device-config.yaml: iluvatars.0.resourceCountName: Field required"),
        (
            "vnpus:\n  configs:\n  - commonWord: X\n    resourceName: huawei.com/X\n    memoryAllocatable: 0\n"
            "    memoryCapacity: 1\n",
            "device-config.yaml: vnpus.configs.0.memoryAllocatable: Input should be greater than 0",
        ),
        (
            "awsneuron:\n  coresPerDevice: zero\n",
            "device-config.yaml: awsneuron.coresPerDevice: Input should be a valid integer",
        ),
    ],
)
def test_config_errors_name_the_field(text, message):
    with pytest.raises(ConfigError) as exc:
        load_device_config(text)
    assert str(exc.value).startswith(message)
