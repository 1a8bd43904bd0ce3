"""The test harness's Kubernetes, in one import: ``from hami_devkit.cluster import KubeCluster``.

Each part lives in a module of its own; this one only re-exports them so callers need one name:

- :mod:`hami_devkit.controlplane` — :class:`KubeCluster`: etcd, kube-apiserver,
  kube-controller-manager, the two kube-schedulers, kwok; the API client the tests use.
- :mod:`hami_devkit.schedconfig` — the kube-scheduler configuration documents (extender).
- :mod:`hami_devkit.kwok` — the fake nodes: kwok's configuration and the Node manifest.
- :mod:`hami_devkit.realnode` — one real node (kubelet + containerd + runc) beside the fake ones;
  :mod:`hami_devkit.nodehost` what it puts on the host (and takes away), :mod:`hami_devkit.nodeconfig`
  its configuration documents.
- :mod:`hami_devkit.process` — child processes (log file, die with the parent, stop a group).
- :mod:`hami_devkit.binaries` — where the pinned binaries live.
- :mod:`hami_devkit.pki` — certificates; :mod:`hami_devkit.errors` — the errors.
"""

from hami_devkit.binaries import (
    KUBE_VERSION,
    OPTIONAL_BINARIES,
    REQUIRED_BINARIES,
    MissingBinaries,
    bin_dir,
    cache_dir,
    find_binaries,
)
from hami_devkit.controlplane import START_TIMEOUT_S, KubeCluster, running_cluster
from hami_devkit.errors import ApiError, ClusterError
from hami_devkit.kwok import DEFAULT_NODE_ALLOCATABLE, KWOK_ANNOTATION, node_manifest
from hami_devkit.process import STOP_TIMEOUT_S, Component, die_with_parent, free_port
from hami_devkit.schedconfig import (
    DEFAULT_MANAGED_RESOURCES,
    DEFAULT_SCHEDULER,
    HAMI_SCHEDULER_NAME,
    ExtenderConfig,
    SchedulerConfig,
)

__all__ = [
    "KUBE_VERSION",
    "OPTIONAL_BINARIES",
    "REQUIRED_BINARIES",
    "MissingBinaries",
    "bin_dir",
    "cache_dir",
    "find_binaries",
    "START_TIMEOUT_S",
    "KubeCluster",
    "running_cluster",
    "ApiError",
    "ClusterError",
    "DEFAULT_NODE_ALLOCATABLE",
    "KWOK_ANNOTATION",
    "node_manifest",
    "STOP_TIMEOUT_S",
    "Component",
    "die_with_parent",
    "free_port",
    "DEFAULT_MANAGED_RESOURCES",
    "DEFAULT_SCHEDULER",
    "HAMI_SCHEDULER_NAME",
    "ExtenderConfig",
    "SchedulerConfig",
]
