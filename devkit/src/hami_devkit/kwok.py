"""kwok: the kubelet of every fake node.

kwok (``sigs.k8s.io/kwok``) manages the nodes annotated ``kwok.x-k8s.io/node: fake``: with its
"fast" stages, pods bound to such a node become Running at once and deleted pods go away.
:func:`node_manifest` writes such a Node; :func:`write_config` and :func:`argv` give kwok its
configuration and command line (the control plane starts it, see
:mod:`hami_devkit.controlplane`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hami_devkit.binaries import MissingBinaries

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
DEFAULT_NODE_ALLOCATABLE = {"cpu": "32", "memory": "256Gi", "pods": "110"}


def node_manifest(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    allocatable: dict[str, str | int] | None = None,
    gpus: int = 0,
    split_count: int = 10,
) -> dict[str, Any]:
    """A Node that kwok manages; ``nvidia.com/gpu`` = ``gpus × split_count`` when ``gpus`` > 0."""
    if gpus < 0 or split_count < 1:
        raise ValueError(f"node {name}: gpus must be >= 0 and split_count >= 1, got {gpus} and {split_count}")
    resources = {**DEFAULT_NODE_ALLOCATABLE, **(allocatable or {})}
    if gpus:
        resources["nvidia.com/gpu"] = gpus * split_count
    resources = {key: str(value) for key, value in resources.items()}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
            "annotations": {KWOK_ANNOTATION: "fake", **(annotations or {})},
        },
        "spec": {},
        "status": {"allocatable": resources, "capacity": dict(resources)},
    }


def write_config(stages_dir: Path, path: Path) -> Path:
    """Concatenate kwok's Stage documents (installed by ``scripts/install-kube.sh`` next to the
    binaries) into one configuration file at ``path``."""
    stages = sorted(stages_dir.glob("*.yaml"))
    if not stages:
        raise MissingBinaries(["kwok-stages/*.yaml"], stages_dir)
    path.write_text("\n---\n".join(stage.read_text() for stage in stages))
    return path


def argv(binary: str, *, kubeconfig: Path, config: Path, port: int) -> list[str]:
    """kwok's command line: manage only nodes annotated ``kwok.x-k8s.io/node: fake``; its own
    health and (fake) kubelet endpoints on 127.0.0.1:``port``."""
    return [
        binary,
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        "--node-ip=127.0.0.1",
        f"--node-port={port}",
        f"--server-address=127.0.0.1:{port}",
        "--cidr=10.244.0.0/16",
        "--node-lease-duration-seconds=40",
    ]
