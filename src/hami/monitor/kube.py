"""The monitor's only API-server call: the pods bound to this node (uid -> namespace/name)."""

from __future__ import annotations

from typing import Any

from .exporter import PodRef


async def api_client(kubeconfig: str | None) -> Any:
    from kubernetes_asyncio import client, config

    if kubeconfig:
        return await config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


async def node_pods(api: Any, node: str) -> dict[str, PodRef]:
    """Every pod with ``spec.nodeName == node`` (paged), by UID. Raises ApiException on failure."""
    from kubernetes_asyncio import client

    core = client.CoreV1Api(api)
    out: dict[str, PodRef] = {}
    token = None
    while True:
        kwargs = {"field_selector": f"spec.nodeName={node}", "limit": 500}
        if token:
            kwargs["_continue"] = token
        page = await core.list_pod_for_all_namespaces(**kwargs)
        for pod in page.items:
            meta = pod.metadata
            if meta.uid:
                out[meta.uid] = PodRef(meta.namespace or "", meta.name or "", meta.uid)
        token = page.metadata._continue if page.metadata else None
        if not token:
            return out
