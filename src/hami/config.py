"""The ``device-config.yaml`` model (HAMi key names, reference §7.1).

``load_device_config(text)`` / ``device_config_from_dict(data)`` return a :class:`DeviceConfig`
or raise :class:`hami.core.errors.ConfigError` with one line naming the key, e.g.
``device-config.yaml: nvidia.defaultMemory: Input should be a valid integer (got 'lots')``.
Only the ``nvidia`` section is modelled field by field today; the other vendors' sections are
kept as plain mappings (``DeviceConfig.section(name)``) until their vendor module lands: a new
vendor adds its own pydantic model here and one entry in ``hami.vendors.VENDORS``.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hami.core.errors import ConfigError

VENDOR_SECTIONS = (
    "nvidia", "cambricon", "hygon", "metax", "mthreads", "iluvatars", "enflame", "kunlun",
    "awsneuron", "amd", "vastai", "biren", "vnpus",
)


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class MigAllowlistEntry(_Model):
    models: list[str] = Field(default_factory=list)
    profiles: list[str] = Field(default_factory=list)


class NvidiaConfig(_Model):
    """``nvidia:`` section (``NvidiaConfig`` with ``NodeDefaultConfig`` inlined)."""

    resource_count_name: str = Field("nvidia.com/gpu", alias="resourceCountName")
    resource_memory_name: str = Field("nvidia.com/gpumem", alias="resourceMemoryName")
    resource_memory_percentage_name: str = Field(
        "nvidia.com/gpumem-percentage", alias="resourceMemoryPercentageName"
    )
    resource_core_name: str = Field("nvidia.com/gpucores", alias="resourceCoreName")
    resource_priority_name: str = Field("nvidia.com/priority", alias="resourcePriorityName")
    overwrite_env: bool = Field(False, alias="overwriteEnv")
    default_memory: int = Field(0, alias="defaultMemory", ge=0)
    default_cores: int = Field(0, alias="defaultCores", ge=0, le=100)
    default_gpu_num: int = Field(1, alias="defaultGPUNum", ge=0)
    memory_factor: int = Field(1, alias="memoryFactor", ge=1)
    disable_core_limit: bool = Field(False, alias="disableCoreLimit")
    gpu_core_policy: str = Field("default", alias="gpuCorePolicy")
    runtime_class_name: str = Field("", alias="runtimeClassName")
    mig_profile_allowlist: list[MigAllowlistEntry] = Field(default_factory=list, alias="migProfileAllowlist")
    # node-overridable defaults
    device_split_count: int = Field(10, alias="deviceSplitCount", ge=1)
    device_memory_scaling: float = Field(1.0, alias="deviceMemoryScaling", gt=0)
    device_core_scaling: float = Field(1.0, alias="deviceCoreScaling", gt=0)
    pre_configured_device_memory: int = Field(0, alias="preConfiguredDeviceMemory", ge=0)
    lib_cuda_log_level: int = Field(1, alias="libCudaLogLevel")
    enable_numa_topology: bool = Field(False, alias="enableNumaTopology")

    @field_validator("gpu_core_policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in ("default", "force", "disable"):
            raise ValueError(f"must be one of default, force, disable (got {v!r})")
        return v


class DeviceConfig(_Model):
    """The whole file. Unknown top-level keys are ignored, as HAMi does."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    nvidia: NvidiaConfig | None = None
    cambricon: dict[str, Any] | None = None
    hygon: dict[str, Any] | None = None
    metax: dict[str, Any] | None = None
    mthreads: dict[str, Any] | None = None
    iluvatars: list[dict[str, Any]] | None = None
    enflame: dict[str, Any] | None = None
    kunlun: dict[str, Any] | None = None
    awsneuron: dict[str, Any] | None = None
    amd: dict[str, Any] | None = None
    vastai: dict[str, Any] | None = None
    biren: dict[str, Any] | None = None
    vnpus: Any = None

    def section(self, name: str) -> Any:
        return getattr(self, name)


def default_device_config() -> DeviceConfig:
    """The configuration used when no file is given: NVIDIA with HAMi's chart defaults."""
    return DeviceConfig(nvidia=NvidiaConfig())


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = err.get("msg", "invalid")
    if err.get("type") == "extra_forbidden":
        return f"{loc}: unknown key (known: {', '.join(VENDOR_SECTIONS)})"
    return f"{loc}: {msg} (got {err.get('input')!r})"


def device_config_from_dict(data: Any, source: str = "device-config.yaml") -> DeviceConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    if not any(data.get(k) for k in VENDOR_SECTIONS):
        raise ConfigError(f"{source}: no vendor section is set (expected one of {', '.join(VENDOR_SECTIONS)})")
    try:
        return DeviceConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc.errors()[0])}") from None


def load_device_config(text: str, source: str = "device-config.yaml") -> DeviceConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return device_config_from_dict(data, source)
