"""Scheduling policies and scores (§5.6), with deterministic ties.

* Node policy: ``binpack`` (default; fullest node first) or ``spread`` (emptiest first).
  Node score = ``10 * (slots/ΣCount + cores/ΣTotalcore + mem/ΣTotalmem)`` over every device of
  the node, where each term is existing usage PLUS this pod's request (HAMi leaves the request
  out). Ties: node name ascending.
* GPU policy: ``binpack`` / ``spread`` (default) / ``numa`` / a comma chain of those, plus the
  filters ``mutex`` and ``topology-aware``. Device score = ``10 * (wSlot*(1+Used)/Count +
  wCore*(cores+Usedcores)/Totalcore + wMem*(mem+Usedmem)/Totalmem)`` including the request.
  NUMA order as HAMi v2.10 walks its sorted list: the ``numa`` key (a chain, bare ``numa``, or
  forced first by ``nvidia.com/numa-bind``) tries the highest NUMA node first, except
  ``numa-bind`` with the single policy ``binpack`` (lowest first); among equal scores the highest
  NUMA node is tried first; the single policy ``mutex`` ranks by use only. Last tie: device index
  ascending (HAMi: registration order from the end). docs/compatibility.md lists the differences.

``request_in_scores=False`` (scheduler flag ``--score-with-request=false``) gives HAMi v2.10's
scores: the node score from usage before the pod, the device score without the request unless
the request type equals the device type (never for NVIDIA: "NVIDIA" vs the model name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .codec import shown
from .errors import RequestError
from .names import DEVICE_SCORING_WEIGHTS, GPU_SCHEDULER_POLICY, NODE_SCHEDULER_POLICY

NODE_POLICY_ANNOTATION = NODE_SCHEDULER_POLICY
GPU_POLICY_ANNOTATION = GPU_SCHEDULER_POLICY
WEIGHTS_ANNOTATION = DEVICE_SCORING_WEIGHTS

NODE_POLICIES = ("binpack", "spread")
GPU_SORT_KEYS = ("binpack", "spread", "numa")
GPU_FILTERS = ("mutex", "topology-aware")


@dataclass(frozen=True, slots=True)
class DevicePolicy:
    keys: tuple[str, ...]  # sort keys in order, from GPU_SORT_KEYS
    mutex: bool = False
    topology_aware: bool = False
    raw: str = "spread"
    #: one value, not a chain (HAMi's single-policy ordering: no comma and not bare ``numa``)
    single: bool = True


@dataclass(frozen=True, slots=True)
class Weights:
    slot: int = 1
    core: int = 1
    memory: int = 1


DEFAULT_WEIGHTS = Weights()


def parse_node_policy(text: str, where: str = "node policy") -> str:
    value = (text or "").strip()
    if value not in NODE_POLICIES:
        raise RequestError(f"{where}: unknown node policy {text!r} (expected binpack or spread)")
    return value


def parse_gpu_policy(text: str, where: str = "gpu policy") -> DevicePolicy:
    parts = [p.strip() for p in (text or "").split(",") if p.strip()]
    if not parts:
        raise RequestError(f"{where}: empty GPU policy")
    unknown = [p for p in parts if p not in GPU_SORT_KEYS + GPU_FILTERS]
    if unknown:
        raise RequestError(
            f"{where}: unknown GPU policy {unknown[0]!r} in {text!r} "
            f"(expected binpack, spread, numa, mutex, topology-aware or a comma chain)"
        )
    single = len(parts) == 1 and parts[0] != "numa" and "," not in text
    keys = tuple(dict.fromkeys(p for p in parts if p in GPU_SORT_KEYS))
    if not keys and not (single and parts[0] == "mutex"):  # bare mutex ranks by use alone (HAMi)
        keys = ("spread",)
    return DevicePolicy(
        keys=keys, mutex="mutex" in parts, topology_aware="topology-aware" in parts, raw=text, single=single
    )


#: A weight: ASCII digits (``str.isdigit`` also takes ``"²"``), at most 6 of them (a weight of
#: thousands of digits cannot be multiplied into a float score)
_WEIGHT = re.compile(r"[0-9]{1,6}")
MAX_WEIGHT = 999_999


def parse_weights(text: str, where: str = WEIGHTS_ANNOTATION) -> Weights:
    """``"slot=1,core=1,memory=3"``: all three keys, integers in 0..999999, at least one > 0."""
    values: dict[str, int] = {}
    for item in (text or "").split(","):
        key, sep, val = item.strip().partition("=")
        if not sep or key not in ("slot", "core", "memory") or not _WEIGHT.fullmatch(val.strip()):
            raise RequestError(
                f"{where}: invalid item {shown(item.strip())} in {shown(text)} "
                f"(expected slot=N,core=N,memory=N, each N in 0..{MAX_WEIGHT})"
            )
        values[key] = int(val)
    if set(values) != {"slot", "core", "memory"}:
        raise RequestError(f"{where}: {shown(text)} must set all of slot, core and memory")
    if not any(values.values()):
        raise RequestError(f"{where}: {shown(text)}: at least one weight must be > 0")
    return Weights(**values)


def device_score(
    count: int,
    totalcore: int,
    totalmem: int,
    used: int,
    usedcores: int,
    usedmem: int,
    cores: int,
    mem: int,
    w: Weights,
    slots: int = 1,
) -> float:
    """``slots``, ``cores``, ``mem``: the request's share (0, 0, 0 for usage alone)."""
    if not count or not totalcore or not totalmem:
        return 0.0
    return 10.0 * (
        w.slot * (slots + used) / count
        + w.core * (cores + usedcores) / totalcore
        + w.memory * (mem + usedmem) / totalmem
    )


def device_sort_key(policy: DevicePolicy, numa_bind: bool):
    """Key function over ``(score, numa, index, used)`` tuples: smaller = tried first.

    HAMi sorts and then walks its list from the END; this key puts first what HAMi reaches first
    (docs/compatibility.md, "NUMA order")."""
    keys = policy.keys
    low_numa_first = False
    if numa_bind and keys[:1] != ("numa",):
        low_numa_first = policy.single and keys == ("binpack",)
        keys = ("numa",) + tuple(k for k in keys if k != "numa")

    def key(t: tuple[float, int, int, int]):
        score, numa, index, used = t
        out: list[float] = [used] if policy.mutex else []
        for k in keys:
            out.append(-score if k == "binpack" else score if k == "spread" else numa if low_numa_first else -numa)
        out.extend((-numa, index))
        return tuple(out)

    return key


def node_score(used: float, count: int, usedcores: float, totalcore: int, usedmem: float, totalmem: int) -> float:
    """HAMi ``ComputeDefaultScore`` form; callers pass usage already including the request."""
    if not count or not totalcore or not totalmem:
        return 0.0
    return 10.0 * (used / count + usedcores / totalcore + usedmem / totalmem)
