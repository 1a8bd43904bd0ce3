"""device-config.yaml values a node agent cannot live with are refused at load, naming the key.

Before, ``deviceSplitCount: 100000000`` loaded, and the device plugin built that many kubelet
IDs per GPU at every start; ``deviceMemoryScaling: 1e308`` loaded, and the registration's
``int(memory * scaling)`` raised OverflowError; ``defaultGPUNum`` beyond int64 loaded, and every
GPU pod was then refused for a ``limits.nvidia.com/gpu`` the pod never wrote.
"""

import pytest

from hami.config import device_config_from_dict, load_device_config
from hami.core.errors import ConfigError
from hami.deviceplugin.devices import DeviceState
from hami.node.nvml import PhysicalGPU
from hami.node.settings import NodeSettings, apply_device_config


GPU = PhysicalGPU(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA A100", 81920, "0000:3b:00.0", 0)


@pytest.mark.parametrize(
    "key, value",
    [
        ("deviceSplitCount", 100_000_000),
        ("deviceMemoryScaling", 1e308),
        ("deviceCoreScaling", 1e308),
        ("defaultMemory", 10**26),
        ("defaultGPUNum", 10**26),
        ("memoryFactor", 10**26),
    ],
)
def test_unlivable_nvidia_values_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError) as err:
        device_config_from_dict({"nvidia": {key: value}})
    assert f"nvidia.{key}:" in str(err.value)


def test_the_largest_values_accepted_still_build_a_registration():
    cfg = device_config_from_dict({"nvidia": {"deviceSplitCount": 1024, "deviceMemoryScaling": 1000}})
    state = DeviceState([GPU], apply_device_config(NodeSettings(), cfg.nvidia))
    assert len(state.kubelet_devices()) == 1024
    assert state.registration()[0].devmem == 81920 * 1000 < 2**31


def test_other_vendors_integers_stay_in_int32():
    with pytest.raises(ConfigError, match=r"hygon\.memoryFactor"):
        device_config_from_dict({"hygon": {"memoryFactor": 2**31}})


def test_a_refused_choice_names_the_value_once():
    with pytest.raises(ConfigError) as err:
        load_device_config("nvidia:\n  gpuCorePolicy: bogus\n")
    assert str(err.value).count("'bogus'") == 1, str(err.value)


def test_a_misspelt_key_is_named_in_a_warning(caplog):
    # HAMi ignores keys it does not know, and so does the load; but a typo silently kept the
    # default (10 slots per GPU here), against configuration.md's "no key silently ignored"
    text = "nvidia:\n  deviceSplitcount: 4\n  knownMigGeometries: []\ncambrion:\n  x: 1\n"
    seen: list[str] = []
    cfg = load_device_config(text, "dc.yaml", warn=seen.append)
    assert cfg.nvidia is not None and cfg.nvidia.device_split_count == 10
    assert seen == [
        "dc.yaml: nvidia.deviceSplitcount: not a key hami reads, ignored (did you mean deviceSplitCount?)",
        "dc.yaml: cambrion: not a key hami reads, ignored (did you mean cambricon?)",
    ]
    caplog.set_level("WARNING", logger="hami.config")
    load_device_config(
        "vnpus:\n  configs:\n  - {commonWord: A, resourceName: a/b, memoryAllocatable: 1,"
        " memoryCapacity: 1, templates: [{name: t, memory: 1, aicore: 1}]}\n",
        "dc.yaml",
    )
    assert [r.getMessage() for r in caplog.records] == [
        "dc.yaml: vnpus.configs[0].templates[0].aicore: not a key hami reads, ignored (did you mean aiCore?)"
    ]


def test_keys_of_hamis_own_chart_we_do_not_need_raise_no_warning():
    """HAMi's chart writes mthreads.memoryPerCard (and may carry knownMigGeometries): a warning
    at every start of every component said nothing the user could act on."""
    text = "nvidia:\n  knownMigGeometries: []\nmthreads:\n  memoryPerCard: [96]\n"
    seen: list[str] = []
    load_device_config(text, "dc.yaml", warn=seen.append)
    assert seen == []


def test_hamis_stock_keys_we_read_raise_no_warning():
    from hami.config import chart_device_config

    data = chart_device_config().model_dump(by_alias=True)
    seen: list[str] = []
    device_config_from_dict(data, warn=seen.append)
    assert seen == []
