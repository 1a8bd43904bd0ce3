"""Node settings: how this node's GPUs are presented, for every node program (§7.1 node
defaults, §7.2 ``config.json``).

Precedence, lowest first: built-in defaults (the chart's values), the ``nvidia`` section of
``device-config.yaml``, then the ``config.json`` entry whose ``name`` equals this node's name.
Every value is validated once here; a bad value is one error naming the file, the field and
the value. The device plugin and the DRA agent read the same :class:`NodeSettings` (the DRA
agent uses the split count, the scalings and the libvgpu knobs).

Not here: what the settings turn into for a container (:mod:`hami.node.contract`), the
cluster-wide ``device-config.yaml`` model (:mod:`hami.config`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hami.config import MAX_SCALING, MAX_SPLIT_COUNT, NvidiaConfig, load_device_config
from hami.core.errors import ConfigError
from hami.core.shape import is_dns1123_subdomain

from .files import read_small

log = logging.getLogger(__name__)

#: where HAMi's device plugin reads config.json, and where the chart mounts its ConfigMap
DEFAULT_NODE_CONFIG = "/config/config.json"


class NodeConfigError(ValueError):
    """A configuration file or value is invalid (the message names file, field and value)."""


OperatingMode = Literal["hami-core", "mig", "mps"]

#: Modes HAMi's config.json accepts that this plugin refuses to start with, and why. MPS needs an
#: ``nvidia-cuda-mps-control`` daemon per GPU and per-client ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` /
#: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``; we run none of it (HAMi's own MPS mode is a stub that hands
#: out whole GPUs with no limit), so starting would give every pod an unlimited GPU.
REFUSED_MODES = {
    "mps": "is not supported (no MPS control daemon is run, so pods would get the whole GPU with no limit); "
    "use hami-core",
}


@dataclass(frozen=True)
class NodeSettings:
    """Everything the plugin needs to know about how to present this node's GPUs."""

    resource_name: str = "nvidia.com/gpu"
    priority_resource: str = "nvidia.com/priority"
    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0
    preconfigured_device_memory: int = 0  # MiB; used when NVML cannot report memory
    libcuda_log_level: str = ""  # "" = do not set LIBCUDA_LOG_LEVEL
    enable_numa_topology: bool = False
    operating_mode: str = "hami-core"
    filter_uuids: frozenset[str] = field(default_factory=frozenset)
    filter_indexes: frozenset[int] = field(default_factory=frozenset)
    enable_preferred_allocation: bool = False
    disable_core_limit: bool = False
    gpu_core_policy: str = "default"
    mig_strategy: str = "none"  # none | mixed (static_mig.py); "single" is refused at start-up
    #: migProfileAllowlist as ((models...), (profiles...)) pairs, in order
    mig_allowlist: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()

    @property
    def socket_name(self) -> str:
        """``nvidia-<resource suffix>.sock``, e.g. ``nvidia-gpu.sock`` (§1.5)."""
        return f"nvidia-{self.resource_name.rsplit('/', 1)[-1]}.sock"


class _Strict(BaseModel):
    # strict: a value is taken as JSON typed it, as Go's encoding/json takes it in HAMi (which then
    # drops the whole file): lax, ``"devicesplitcount": true`` was a split count of 1 and
    # ``"enablenumatopology": "no"`` false, with no word
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class _FilterDevices(_Strict):
    uuid: list[str] = Field(default_factory=list)
    index: list[int] = Field(default_factory=list)

    @field_validator("uuid", "index", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        # Go's decoder reads a JSON null into a slice as an empty one ("uuid": null filters
        # nothing); refused here, it stopped the node's plugin
        return [] if value is None else value


class _NodeEntry(_Strict):
    """One ``nodeconfig`` entry of config.json (HAMi's lower-case keys; any case is read, as Go's
    encoding/json does: apply_node_config)."""

    name: str
    operatingmode: OperatingMode | None = None
    # (bounded as device-config.yaml's: 1e308 made the registration an OverflowError)
    devicememoryscaling: float | None = Field(default=None, gt=0, le=MAX_SCALING)
    devicecorescaling: float | None = Field(default=None, gt=0, le=MAX_SCALING)
    devicesplitcount: int | None = Field(default=None, ge=1, le=MAX_SPLIT_COUNT)
    preconfigureddevicememory: int | None = Field(default=None, ge=0)
    libcudaloglevel: str | int | None = None
    enablenumatopology: bool | None = None
    migstrategy: str | None = None
    filterdevices: _FilterDevices | None = None
    enablegetpreferredallocation: bool | None = None


def _describe(exc: ValidationError, where: str) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{where}: field {loc!r}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)


_JSON_MAP = {
    "operatingmode": "operating_mode",
    "devicememoryscaling": "device_memory_scaling",
    "devicecorescaling": "device_core_scaling",
    "devicesplitcount": "device_split_count",
    "preconfigureddevicememory": "preconfigured_device_memory",
    "libcudaloglevel": "libcuda_log_level",
    "enablenumatopology": "enable_numa_topology",
    "enablegetpreferredallocation": "enable_preferred_allocation",
    "migstrategy": "mig_strategy",
}


def _overlay(base: NodeSettings, model: BaseModel, mapping: Mapping[str, str]) -> NodeSettings:
    changes: dict[str, Any] = {}
    for key, attr in mapping.items():
        value = getattr(model, key)
        if value is not None:
            changes[attr] = str(value) if attr == "libcuda_log_level" else value
    return replace(base, **changes)


def apply_device_config(base: NodeSettings, nvidia: NvidiaConfig | None) -> NodeSettings:
    """Overlay the ``nvidia`` section of device-config.yaml (parsed by :mod:`hami.config`)."""
    if nvidia is None:
        return base
    return replace(
        base,
        resource_name=nvidia.resource_count_name,
        priority_resource=nvidia.resource_priority_name,
        device_split_count=nvidia.device_split_count,
        device_memory_scaling=nvidia.device_memory_scaling,
        device_core_scaling=nvidia.device_core_scaling,
        preconfigured_device_memory=nvidia.pre_configured_device_memory,
        libcuda_log_level=str(nvidia.lib_cuda_log_level),
        enable_numa_topology=nvidia.enable_numa_topology,
        disable_core_limit=nvidia.disable_core_limit,
        gpu_core_policy=nvidia.gpu_core_policy,
        mig_allowlist=tuple((tuple(e.models), tuple(e.profiles)) for e in nvidia.mig_profile_allowlist),
    )


def _fold(obj: Any, known: frozenset[str]) -> Any:
    """``obj``'s keys matched to ``known`` (lower-case) names in any case, as Go's encoding/json
    decodes HAMi's config.json (``deviceSplitCount`` is ``devicesplitcount``; of two spellings of
    one key, the later wins, as in Go). Keys matching no known name are kept as they are."""
    if not isinstance(obj, dict):
        return obj
    out: dict[Any, Any] = {}
    for key, value in obj.items():
        name = key.lower() if isinstance(key, str) and key.lower() in known else key
        out.pop(name, None)
        out[name] = value
    return out


_ENTRY_KEYS = frozenset(_NodeEntry.model_fields)
_FILTER_KEYS = frozenset(_FilterDevices.model_fields)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_entry_name(entry: Any, where: str) -> None:
    """Every entry is an object or null (Go's decoder refuses the whole file otherwise), named by a node
    name. One named otherwise applies to no node, so the node it was written for runs on defaults:
    that is a warning, not a refusal, since every node's plugin reads every entry and a dead entry
    must not stop the plugin on all of them. ``null`` is Go's zero entry (no name, no error)."""
    if entry is None:
        log.warning("%s: a null entry applies to no node", where)
        return
    if not isinstance(entry, dict):
        raise NodeConfigError(f"{where}: expected an object with a 'name', got {_short(entry)}")
    names = [v for k, v in entry.items() if isinstance(k, str) and k.lower() == "name"]
    if not names:
        log.warning("%s: field 'name' is missing: the entry applies to no node", where)
        return
    name = names[-1]  # of two spellings the later wins (_fold)
    if not isinstance(name, str) or not is_dns1123_subdomain(name):  # a node name: no node matches it
        log.warning(
            "%s: field 'name': %s is not a Kubernetes node name (lower-case letters, digits, '-' and '.'): "
            "the entry applies to no node",
            where,
            _short(name),
        )


def apply_node_config(base: NodeSettings, doc: Any, node_name: str, where: str) -> NodeSettings:
    """Overlay the ``config.json`` entry named ``node_name``. Of the other entries only the shape
    and the ``name`` are checked (a bad value of another node's entry stops that node's plugin,
    not this one). Keys are matched in any case, as HAMi's device plugin (Go's encoding/json)
    reads them."""
    if doc is None:
        return base
    if not isinstance(doc, dict):
        raise NodeConfigError(
            f'{where}: expected a JSON object {{"nodeconfig": [...]}}, got a {type(doc).__name__}: {_short(doc)}'
        )
    doc = _fold(doc, frozenset({"nodeconfig"}))
    if doc.get("nodeconfig") is None:
        # no entries: the node keeps its defaults, as in HAMi ({} included); other keys alone
        # are a misspelled "nodeconfig", which would leave every node at its defaults unnoticed
        if set(doc) - {"nodeconfig"}:
            raise NodeConfigError(f"{where}: no 'nodeconfig' list (keys found: {', '.join(map(repr, doc))})")
        return base
    entries = doc["nodeconfig"]
    if not isinstance(entries, list):
        raise NodeConfigError(f"{where}: field 'nodeconfig' must be a list of node entries, got {_short(entries)}")
    for i, e in enumerate(entries):
        _check_entry_name(e, f"{where} nodeconfig[{i}]")
    entries = [_fold(e, _ENTRY_KEYS) for e in entries]
    for e in entries:
        if isinstance(e, dict) and "filterdevices" in e:
            e["filterdevices"] = _fold(e["filterdevices"], _FILTER_KEYS)
    mine = [(i, e) for i, e in enumerate(entries) if isinstance(e, dict) and e.get("name") == node_name]
    if len(mine) > 1:
        raise NodeConfigError(f"{where}: node {node_name!r} has {len(mine)} entries in 'nodeconfig'; keep one")
    if not mine:
        return base
    i, raw = mine[0]
    try:
        entry = _NodeEntry.model_validate(raw)
    except ValidationError as exc:
        raise NodeConfigError(_describe(exc, f"{where} nodeconfig[{i}] (node {node_name!r})")) from None
    if entry.operatingmode in REFUSED_MODES:
        raise NodeConfigError(
            f"{where} nodeconfig[{i}] (node {node_name!r}): field 'operatingmode': "
            f"{entry.operatingmode!r} {REFUSED_MODES[entry.operatingmode]}"
        )
    out = _overlay(base, entry, _JSON_MAP)
    if entry.filterdevices is not None:
        out = replace(
            out,
            filter_uuids=frozenset(entry.filterdevices.uuid),
            filter_indexes=frozenset(entry.filterdevices.index),
        )
    return out


def _read(path: Path, loader, what: str) -> Any:
    try:
        text = read_small(path).decode()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NodeConfigError(f"{what} {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise NodeConfigError(f"{what} {path}: not UTF-8 text ({exc})") from None
    try:
        return loader(text)
    except json.JSONDecodeError as exc:
        raise NodeConfigError(f"{what} {path}: not valid ({exc})") from None


def check_node_config(path: str | Path | None) -> None:
    """At start-up: a ``--node-config`` file that is not there is refused, except at HAMi's path
    (:data:`DEFAULT_NODE_CONFIG`), which the chart fills from a ConfigMap: one named by
    ``devicePlugin.nodeConfiguration.externalConfigName`` may have no ``config.json`` key, and
    HAMi's plugin then runs on the defaults (logged here). ``None`` / "" names no file."""
    if not path or Path(path).exists():
        return
    if str(path) == DEFAULT_NODE_CONFIG:
        log.warning(
            "%s does not exist: no per-node settings, this node runs on device-config.yaml's "
            "(the chart's ConfigMap always has config.json; one named by "
            "devicePlugin.nodeConfiguration.externalConfigName needs a config.json key)",
            path,
        )
        return
    raise NodeConfigError(f"--node-config: no such file {str(path)!r}")


def load_settings(
    node_name: str,
    device_config: str | Path | None = None,
    node_config: str | Path | None = None,
    base: NodeSettings | None = None,
) -> NodeSettings:
    """Defaults <- device-config.yaml ``nvidia`` <- config.json entry for ``node_name``.

    Missing files are fine here (the chart defaults of :class:`hami.config.NvidiaConfig` apply;
    the commands refuse a named one first: :func:`check_node_config`); unreadable or invalid
    ones are errors.
    """
    nvidia = NvidiaConfig()
    if device_config:
        path = Path(device_config)
        text = _read(path, str, "device-config")
        if text is not None:
            try:
                nvidia = load_device_config(text, str(path)).nvidia or nvidia
            except ConfigError as exc:
                raise NodeConfigError(str(exc)) from None
    settings = apply_device_config(base or NodeSettings(), nvidia)
    if node_config:
        path = Path(node_config)
        settings = apply_node_config(settings, _read(path, json.loads, "config.json"), node_name, f"config.json {path}")
    return settings
