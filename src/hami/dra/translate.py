"""HAMi's resource requests turned into DRA claims, so that manifests work unchanged on the DRA
front end (pure: the webhook calls :func:`translate` and creates the templates it returns).

A container asking for ``nvidia.com/gpu: N`` (+ ``gpumem`` / ``gpumem-percentage`` /
``gpucores``), after the same admission defaults as on the extender path, gets its own claim
from a ResourceClaimTemplate whose one request asks the share class for N devices with these
capacity requests:

================================================  ==========================================
HAMi request (after defaults)                     DRA request
================================================  ==========================================
``gpumem: M`` (MiB, times ``memoryFactor``)       ``capacity.requests.memory: <M>Mi``
no memory, or ``gpumem-percentage: 100``          no memory request: the device's default,
                                                  which is all of its memory
``gpumem-percentage: P`` (P < 100)                refused: DRA capacity requests are amounts,
                                                  not fractions of a device of unknown size
``gpucores: C``                                   ``capacity.requests.cores: C``
``gpucores: 100`` (HAMi: the GPU is exclusive)    cores 100 and no memory request (all of it),
                                                  so nothing else fits beside it
N > 1                                             a ``distinctAttribute`` constraint on the
                                                  UUID: N different GPUs, as HAMi gives
================================================  ==========================================

The template name is derived from its content (``hami-gpu-<hash>``), so every pod with the same
request shares one template per namespace and creating it again is a no-op. The container's GPU
resources are removed from ``limits``/``requests`` (nothing advertises them on a DRA node) and a
``resources.claims`` entry names the pod's claim. Each container gets its own claim, except that
an app container whose request is the same as an init container's takes that init container's
claim (HAMi's reuse of an init container's GPU: the init container has exited by then, so the pod
holds one share, not two). Each init claim is reused by one app container at most (app containers
run together and must not share one budget), and never that of a sidecar (an init container with
``restartPolicy: Always`` runs beside the app containers).
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Mapping, Sequence

from hami.core import pod_request
from hami.core.errors import RequestError
from hami.core.types import PERCENT_UNSET

from .model import CORES, DRIVER, MEMORY, SHARE_CLASS

REQUEST_NAME = "gpu"
CLAIM_PREFIX = "hami-gpu-"


class TranslationError(RequestError):
    """A request that the DRA front end cannot express; names the container and resource."""


def _claim_spec(nums: int, memory_mib: int | None, cores: int, device_class: str) -> dict[str, Any]:
    requests: dict[str, str] = {CORES: str(cores)}
    if memory_mib is not None:
        requests[MEMORY] = f"{memory_mib}Mi"
    exactly = {
        "deviceClassName": device_class,
        "allocationMode": "ExactCount",
        "count": nums,
        "capacity": {"requests": requests},
    }
    devices: dict[str, Any] = {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}
    if nums > 1:
        devices["constraints"] = [{"requests": [REQUEST_NAME], "distinctAttribute": f"{DRIVER}/uuid"}]
    return {"devices": devices}  # a ResourceClaimSpec


def template_name(spec: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return f"{CLAIM_PREFIX}{digest}"


def _strip(container: dict, names: Sequence[str]) -> None:
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, dict):
            for n in names:
                values.pop(n, None)
            if not values:
                resources.pop(section)


def translate(
    pod: Mapping[str, Any], vendor: Any, device_class: str = SHARE_CLASS, namespace: str = ""
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(pod using claims, ResourceClaimTemplates it needs). ``pod`` is admitted (defaults applied);
    ``vendor`` is the NVIDIA vendor (its resource names and defaults). A pod with no NVIDIA
    request comes back unchanged with no template."""
    req = pod_request(pod, [vendor])
    out = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    names = vendor.resources
    gpu_resources = [n for n in (names.count, names.memory, names.memory_percentage, names.cores) if n]
    templates: dict[str, dict[str, Any]] = {}
    claims = list(spec.get("resourceClaims") or [])
    taken = {c.get("name") for c in claims}
    n_init = len(spec.get("initContainers") or [])
    reusable: dict[str, list[str]] = {}  # template name -> init claims an app container may take
    for i, (c, creq) in enumerate(zip(containers, req.containers)):
        r = creq.for_vendor(vendor.name)
        if r is None:
            continue
        where = f"pod {(pod.get('metadata') or {}).get('name') or '?'} container {creq.name!r}"
        pct = r.mem_percentage
        if pct != PERCENT_UNSET and pct != 100:
            raise TranslationError(
                f"{where}: {names.memory_percentage}={pct} cannot be expressed on the DRA front end "
                f"(capacity requests are amounts); ask for {names.memory} in MiB instead"
            )
        exclusive = r.coresreq >= 100 or pct == 100 or r.memreq <= 0
        cspec = _claim_spec(r.nums, None if exclusive else r.memreq, r.coresreq, device_class)
        tname = template_name(cspec)
        templates[tname] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": tname,
                "labels": {"app.kubernetes.io/managed-by": "hami-webhook"},
                **({"namespace": namespace} if namespace else {}),
            },
            "spec": {"spec": cspec},
        }
        if i >= n_init and reusable.get(tname):
            claim = reusable[tname].pop(0)  # the init container's, which has exited by now
        else:
            claim = f"{CLAIM_PREFIX}{i}"
            while claim in taken:
                claim += "x"
            taken.add(claim)
            claims.append({"name": claim, "resourceClaimTemplateName": tname})
            if i < n_init and c.get("restartPolicy") != "Always":
                reusable.setdefault(tname, []).append(claim)
        _strip(c, gpu_resources)
        resources = c.setdefault("resources", {})
        resources["claims"] = [*(resources.get("claims") or []), {"name": claim}]
    if templates:
        spec["resourceClaims"] = claims
    return out, list(templates.values())
