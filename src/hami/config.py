"""The ``device-config.yaml`` model (HAMi key names, reference §7.1).

``load_device_config(text)`` / ``device_config_from_dict(data)`` return a :class:`DeviceConfig`
or raise :class:`hami.core.errors.ConfigError` with one line naming the key, e.g.
``device-config.yaml: nvidia.defaultMemory: Input should be a valid integer (got 'lots')``.
Every vendor section has its pydantic model here (defaults = the Helm chart's). A new vendor
adds its model here and one entry in ``hami.vendors.VENDORS``. ``chart_device_config()`` enables every implemented vendor.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import stat
from typing import Any, Callable, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hami import safeyaml
from hami.core.errors import ConfigError

log = logging.getLogger(__name__)


def flag_bool(text: str) -> bool:
    """A boolean flag's value, as Go's flag package reads one (``--x=true``, ``--x=0``): HAMi's
    manifests pass booleans that way. With ``nargs="?", const=True`` the bare flag means true."""
    value = str(text).strip().lower()
    if value in ("1", "t", "true", "yes", "on"):
        return True
    if value in ("0", "f", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


#: HAMi reads these counts into Go's int32 (a larger value fails its load); past it, ours would
#: come back as a pod's limit no quantity parser takes, blamed on the pod
INT32_MAX = 2**31 - 1
#: kubelet IDs per GPU: the device plugin builds them all at every start (config.json's bound too)
MAX_SPLIT_COUNT = 1024
#: registered memory and cores are NVML's figures times these: at most 1000 keeps even a 2 TiB
#: GPU's registration an int32 (HAMi's Devmem); an unbounded 1e308 turned it into infinity
MAX_SCALING = 1000.0


class MigAllowlistEntry(_Model):
    models: list[str] = Field(default_factory=list)
    profiles: list[str] = Field(default_factory=list)


class NvidiaConfig(_Model):
    """``nvidia:`` section (``NvidiaConfig`` with ``NodeDefaultConfig`` inlined)."""

    resource_count_name: str = Field("nvidia.com/gpu", alias="resourceCountName")
    resource_memory_name: str = Field("nvidia.com/gpumem", alias="resourceMemoryName")
    resource_memory_percentage_name: str = Field("nvidia.com/gpumem-percentage", alias="resourceMemoryPercentageName")
    resource_core_name: str = Field("nvidia.com/gpucores", alias="resourceCoreName")
    resource_priority_name: str = Field("nvidia.com/priority", alias="resourcePriorityName")
    overwrite_env: bool = Field(False, alias="overwriteEnv")
    default_memory: int = Field(0, alias="defaultMemory", ge=0, le=INT32_MAX)
    default_cores: int = Field(0, alias="defaultCores", ge=0, le=100)
    default_gpu_num: int = Field(1, alias="defaultGPUNum", ge=0, le=INT32_MAX)
    memory_factor: int = Field(1, alias="memoryFactor", ge=1, le=INT32_MAX)
    disable_core_limit: bool = Field(False, alias="disableCoreLimit")
    gpu_core_policy: str = Field("default", alias="gpuCorePolicy")
    runtime_class_name: str = Field("", alias="runtimeClassName")
    mig_profile_allowlist: list[MigAllowlistEntry] = Field(default_factory=list, alias="migProfileAllowlist")
    # node-overridable defaults
    device_split_count: int = Field(10, alias="deviceSplitCount", ge=1, le=MAX_SPLIT_COUNT)
    device_memory_scaling: float = Field(1.0, alias="deviceMemoryScaling", gt=0, le=MAX_SCALING)
    device_core_scaling: float = Field(1.0, alias="deviceCoreScaling", gt=0, le=MAX_SCALING)
    pre_configured_device_memory: int = Field(0, alias="preConfiguredDeviceMemory", ge=0, le=INT32_MAX)
    lib_cuda_log_level: int = Field(1, alias="libCudaLogLevel")
    enable_numa_topology: bool = Field(False, alias="enableNumaTopology")

    @field_validator("gpu_core_policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in ("default", "force", "disable"):
            raise ValueError("must be one of default, force, disable")
        return v


class _Names(_Model):
    """Resource names shared by the simple vendors (count / memory / core)."""

    resource_count_name: str = Field(alias="resourceCountName")
    resource_memory_name: str = Field("", alias="resourceMemoryName")
    resource_core_name: str = Field("", alias="resourceCoreName")


class CambriconConfig(_Names):
    resource_count_name: str = Field("cambricon.com/vmlu", alias="resourceCountName")
    resource_memory_name: str = Field("cambricon.com/mlu.smlu.vmemory", alias="resourceMemoryName")
    resource_core_name: str = Field("cambricon.com/mlu.smlu.vcore", alias="resourceCoreName")


class HygonConfig(_Names):
    resource_count_name: str = Field("hygon.com/dcunum", alias="resourceCountName")
    resource_memory_name: str = Field("hygon.com/dcumem", alias="resourceMemoryName")
    resource_core_name: str = Field("hygon.com/dcucores", alias="resourceCoreName")
    memory_factor: int = Field(1, alias="memoryFactor", ge=1, le=INT32_MAX)


class MetaxConfig(_Model):
    resource_count_name: str = Field("metax-tech.com/gpu", alias="resourceCountName")
    resource_vcount_name: str = Field("metax-tech.com/sgpu", alias="resourceVCountName")
    resource_vmemory_name: str = Field("metax-tech.com/vmemory", alias="resourceVMemoryName")
    resource_vcore_name: str = Field("metax-tech.com/vcore", alias="resourceVCoreName")
    sgpu_topology_aware: bool = Field(False, alias="sgpuTopologyAware")

    @field_validator("sgpu_topology_aware")
    @classmethod
    def _no_topology(cls, v: bool) -> bool:
        if v:
            raise ValueError(
                "true is not supported (sGPU placement does not use link zones); remove the key or set false"
            )
        return v


class MthreadsConfig(_Names):
    resource_count_name: str = Field("mthreads.com/vgpu", alias="resourceCountName")
    resource_memory_name: str = Field("mthreads.com/sgpu-memory", alias="resourceMemoryName")
    resource_core_name: str = Field("mthreads.com/sgpu-core", alias="resourceCoreName")


class IluvatarChip(_Names):
    """One entry of ``iluvatars:`` (one backend per chip)."""

    chip_name: str = Field(alias="chipName", min_length=1)
    common_word: str = Field(alias="commonWord", min_length=1)


class EnflameConfig(_Model):
    resource_name_gcu: str = Field("enflame.com/gcu", alias="resourceNameGCU")
    resource_name_drs_gcu: str = Field("enflame.com/drs-gcu", alias="resourceNameDRSGCU")
    resource_name_gcu_memory: str = Field("enflame.com/gcu-memory", alias="resourceNameGCUMemory")
    resource_name_gcu_core: str = Field("enflame.com/gcu-core", alias="resourceNameGCUCore")
    #: HAMi's legacy vGCU names: accepted at HAMi's defaults (its stock file carries them), refused
    #: otherwise, since no vGCU backend reads them (use resourceNameDRSGCU / GCUMemory / GCUCore).
    resource_name_vgcu: str = Field("enflame.com/vgcu", alias="resourceNameVGCU")
    resource_name_vgcu_percentage: str = Field("enflame.com/vgcu-percentage", alias="resourceNameVGCUPercentage")

    @field_validator("resource_name_vgcu", "resource_name_vgcu_percentage")
    @classmethod
    def _legacy(cls, v: str, info: Any) -> str:
        default = cls.model_fields[info.field_name].default
        if v != default:
            raise ValueError(
                f"legacy vGCU resources are not served (only {default!r} is accepted, as a no-op); "
                "use resourceNameDRSGCU, resourceNameGCUMemory, resourceNameGCUCore"
            )
        return v


class KunlunConfig(_Model):
    resource_count_name: str = Field("kunlunxin.com/xpu", alias="resourceCountName")
    resource_vcount_name: str = Field("kunlunxin.com/vxpu", alias="resourceVCountName")
    resource_vmemory_name: str = Field("kunlunxin.com/vxpu-memory", alias="resourceVMemoryName")


class AwsNeuronConfig(_Names):
    resource_count_name: str = Field("aws.amazon.com/neuron", alias="resourceCountName")
    resource_core_name: str = Field("aws.amazon.com/neuroncore", alias="resourceCoreName")
    #: our extension: NeuronCores per device, used by admission (HAMi hard-codes 2)
    cores_per_device: int = Field(2, alias="coresPerDevice", ge=1, le=INT32_MAX)


class AmdConfig(_Names):
    resource_count_name: str = Field("amd.com/gpu", alias="resourceCountName")
    resource_memory_name: str = Field("amd.com/gpumem", alias="resourceMemoryName")
    resource_core_name: str = Field("amd.com/gpucores", alias="resourceCoreName")


class WholeDeviceConfig(_Model):
    """``vastai:`` / ``biren:`` (count resource only)."""

    resource_count_name: str = Field(alias="resourceCountName", min_length=1)


class VastaiConfig(WholeDeviceConfig):
    resource_count_name: str = Field("vastaitech.com/va", alias="resourceCountName", min_length=1)


class BirenConfig(WholeDeviceConfig):
    resource_count_name: str = Field("birentech.com/gpu", alias="resourceCountName", min_length=1)


class VnpuTemplate(_Model):
    name: str = Field(min_length=1)
    memory: int = Field(gt=0, le=INT32_MAX)
    ai_core: int = Field(0, alias="aiCore", ge=0, le=INT32_MAX)
    ai_cpu: int = Field(0, alias="aiCPU", ge=0, le=INT32_MAX)


class VnpuChip(_Model):
    """One entry of ``vnpus.configs`` (one Ascend backend per chip)."""

    chip_name: str = Field("", alias="chipName")
    common_word: str = Field(alias="commonWord", min_length=1)
    resource_name: str = Field(alias="resourceName", min_length=1)
    resource_memory_name: str = Field("", alias="resourceMemoryName")
    resource_core_name: str = Field("", alias="resourceCoreName")
    memory_allocatable: int = Field(alias="memoryAllocatable", gt=0, le=INT32_MAX)
    memory_capacity: int = Field(alias="memoryCapacity", gt=0, le=INT32_MAX)
    memory_factor: int = Field(1, alias="memoryFactor", ge=1, le=INT32_MAX)
    ai_core: int = Field(0, alias="aiCore", ge=0, le=INT32_MAX)
    ai_cpu: int = Field(0, alias="aiCPU", ge=0, le=INT32_MAX)
    runtime_class_name: str = Field("", alias="runtimeClassName")
    overwrite_env: bool = Field(False, alias="overwriteEnv")
    super_pod: bool = Field(False, alias="superPod")
    templates: list[VnpuTemplate] = Field(default_factory=list)


def _chip(
    cw: str,
    chip: str,
    alloc: int,
    cap: int,
    ai_core: int,
    ai_cpu: int,
    templates: list[tuple[str, int, int, int]],
    super_pod: bool = False,
) -> VnpuChip:
    return VnpuChip(
        chipName=chip,
        commonWord=cw,
        resourceName=f"huawei.com/{cw}",
        resourceMemoryName=f"huawei.com/{cw}-memory",
        resourceCoreName=f"huawei.com/{cw}-core",
        memoryAllocatable=alloc,
        memoryCapacity=cap,
        aiCore=ai_core,
        aiCPU=ai_cpu,
        superPod=super_pod,
        templates=[VnpuTemplate(name=n, memory=m, aiCore=c, aiCPU=u) for n, m, c, u in templates],
    )


def default_vnpu_chips() -> list[VnpuChip]:
    """The Helm chart's ``vnpus.configs`` (reference §7.1)."""
    b3 = [("vir05_1c_16g", 16384, 5, 1), ("vir10_3c_32g", 32768, 10, 3)]
    return [
        _chip(
            "Ascend910A",
            "910A",
            32768,
            32768,
            30,
            0,
            [("vir02", 2184, 2, 0), ("vir04", 4369, 4, 0), ("vir08", 8738, 8, 0), ("vir16", 17476, 16, 0)],
        ),
        _chip(
            "Ascend910B2",
            "910B2",
            65536,
            65536,
            24,
            6,
            [("vir03_1c_8g", 8192, 3, 1), ("vir06_1c_16g", 16384, 6, 1), ("vir12_3c_32g", 32768, 12, 3)],
        ),
        _chip("Ascend910B3", "910B3", 65536, 65536, 20, 7, b3),
        _chip("Ascend910B4-1", "910B4-1", 65536, 65536, 20, 7, b3),
        _chip(
            "Ascend910B4", "910B4", 32768, 32768, 20, 7, [("vir05_1c_8g", 8192, 5, 1), ("vir10_3c_16g", 16384, 10, 3)]
        ),
        _chip(
            "Ascend310P",
            "310P3",
            21527,
            24576,
            8,
            7,
            [("vir01", 3072, 1, 1), ("vir02", 6144, 2, 2), ("vir04", 12288, 4, 4)],
        ),
        _chip("Ascend910C", "Ascend910", 65536, 65536, 20, 7, b3, super_pod=True),
    ]


class VnpusConfig(_Model):
    """``vnpus:`` (Ascend). An absent or empty ``configs`` means the chart's chips."""

    hami_vnpu_core: bool = Field(False, alias="hamiVnpuCore")
    configs: list[VnpuChip] = Field(default_factory=list)

    def chips(self) -> list[VnpuChip]:
        return self.configs or default_vnpu_chips()


def default_iluvatar_chips() -> list[IluvatarChip]:
    """The Helm chart's ``iluvatars`` list."""
    return [
        IluvatarChip(
            chipName=c,
            commonWord=c,
            resourceCountName=f"iluvatar.ai/{c}-vgpu",
            resourceMemoryName=f"iluvatar.ai/{c}.vMem",
            resourceCoreName=f"iluvatar.ai/{c}.vCore",
        )
        for c in ("MR-V100", "MR-V50", "BI-V150", "BI-V100")
    ]


class DeviceConfig(_Model):
    """The whole file. Unknown top-level keys are ignored, as HAMi does."""

    nvidia: NvidiaConfig | None = None
    cambricon: CambriconConfig | None = None
    hygon: HygonConfig | None = None
    metax: MetaxConfig | None = None
    mthreads: MthreadsConfig | None = None
    iluvatars: list[IluvatarChip] | None = None
    enflame: EnflameConfig | None = None
    kunlun: KunlunConfig | None = None
    awsneuron: AwsNeuronConfig | None = None
    amd: AmdConfig | None = None
    vastai: VastaiConfig | None = None
    biren: BirenConfig | None = None
    vnpus: VnpusConfig | None = None

    def section(self, name: str) -> Any:
        return getattr(self, name)


#: the top-level keys, one per vendor section
VENDOR_SECTIONS = tuple(DeviceConfig.model_fields)


def default_device_config() -> DeviceConfig:
    """The configuration used when no file is given: NVIDIA with HAMi's chart defaults."""
    return DeviceConfig(nvidia=NvidiaConfig())


def chart_device_config() -> DeviceConfig:
    """Every vendor section this project implements, at the Helm chart's defaults."""
    return DeviceConfig(
        nvidia=NvidiaConfig(),
        cambricon=CambriconConfig(),
        hygon=HygonConfig(),
        metax=MetaxConfig(),
        mthreads=MthreadsConfig(),
        iluvatars=default_iluvatar_chips(),
        enflame=EnflameConfig(),
        kunlun=KunlunConfig(),
        awsneuron=AwsNeuronConfig(),
        amd=AmdConfig(),
        vastai=VastaiConfig(),
        biren=BirenConfig(),
        vnpus=VnpusConfig(),
    )


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"{loc}: {err.get('msg', 'invalid')} (got {err.get('input')!r})"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, in a list, or optional (``list[VnpuChip] | None``)."""
    for arg in (annotation, *get_args(annotation)):
        for inner in (arg, *get_args(arg)):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return None


#: keys of HAMi's own device-config that this project does not need, and why: not warned about
#: (HAMi's chart writes them, so every start of every component warned), only logged at info
HAMI_KEYS_UNUSED = {
    "mthreads.memoryPerCard": "a node's cards are counted from its core capacity, 16 per card",
    "nvidia.knownMigGeometries": "MIG profiles and placements are read from NVML on the node",
}


def ignored_keys(data: Any, model: type[BaseModel] = DeviceConfig, where: str = "") -> list[tuple[str, str]]:
    """``(path, likely key)`` for every key of ``data`` the models do not read
    (``("nvidia.deviceSplitcount", "deviceSplitCount")``; ``""`` when none is close). HAMi ignores
    such keys too, so they are not refused."""
    if not isinstance(data, dict):
        return []
    known: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        known[name] = known[field.alias or name] = field
    out: list[tuple[str, str]] = []
    for key, value in data.items():
        here = f"{where}.{key}" if where else str(key)
        field = known.get(key)
        if field is None:
            aliases = [f.alias or n for n, f in model.model_fields.items()]
            close = [a for a in aliases if a.lower() == str(key).lower()] or difflib.get_close_matches(
                str(key), aliases, n=1, cutoff=0.8
            )
            out.append((here, close[0] if close else ""))
            continue
        sub = _model_of(field.annotation)
        if sub is None:
            continue
        for i, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
            out += ignored_keys(item, sub, here if i is None else f"{here}[{i}]")
    return out


def device_config_from_dict(
    data: Any, source: str = "device-config.yaml", warn: Callable[[str], None] | None = None
) -> DeviceConfig:
    """``warn`` gets one line per key nothing reads (default: a warning in the log)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    if not any(data.get(k) for k in VENDOR_SECTIONS):
        raise ConfigError(f"{source}: no vendor section is set (expected one of {', '.join(VENDOR_SECTIONS)})")
    try:
        config = DeviceConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc.errors()[0])}") from None
    for key, likely in ignored_keys(data):
        if key in HAMI_KEYS_UNUSED:
            log.info("%s: %s: HAMi's key, not used here (%s)", source, key, HAMI_KEYS_UNUSED[key])
            continue
        # a misspelt key would otherwise leave its default in force without a word
        hint = f" (did you mean {likely}?)" if likely else ""
        (warn or log.warning)(f"{source}: {key}: not a key hami reads, ignored{hint}")
    return config


def load_device_config(
    text: str, source: str = "device-config.yaml", warn: Callable[[str], None] | None = None
) -> DeviceConfig:
    try:
        data = safeyaml.load(text, source)
    except safeyaml.YamlInputError as exc:
        raise ConfigError(str(exc)) from None
    return device_config_from_dict(data, source, warn)


#: a device-config.yaml is a few KiB; a path naming a log or a core dump is refused, not read
MAX_CONFIG_BYTES = 4 << 20


def read_device_config_file(path: str, flag: str, warn: Callable[[str], None] | None = None) -> DeviceConfig:
    """The device-config.yaml a flag names, for every command that takes one. A file that is
    missing, not a regular file, unreadable, not UTF-8 or not valid is a :class:`ConfigError`
    of one line naming the flag and the path: running on the defaults instead would serve other
    resource names and split counts than the scheduler's, without a word."""

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"{flag}: {why}")

    try:
        # O_NONBLOCK: a FIFO at the path must not hang the start; it is refused below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise refuse(f"no such file {path!r}") from None
    except OSError as exc:
        raise refuse(f"cannot read {path!r} ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise refuse(f"{path!r} is {kind}")
        if st.st_size > MAX_CONFIG_BYTES:
            raise refuse(f"{path!r} is {st.st_size} bytes, more than a device-config.yaml ({MAX_CONFIG_BYTES})")
        try:
            raw = os.read(fd, MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise refuse(f"cannot read {path!r} ({exc.strerror})") from None
    finally:
        os.close(fd)
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise refuse(f"{path!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return load_device_config(text, path, warn)
    except ConfigError as exc:  # the message names the path and the key
        raise refuse(str(exc)) from None
