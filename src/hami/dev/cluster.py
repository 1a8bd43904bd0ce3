"""The test harness's Kubernetes, in one import: ``from hami.dev.cluster import KubeCluster``.

Each part lives in a module of its own; this one only re-exports them so callers need one name:

- :mod:`hami.dev.controlplane` — :class:`KubeCluster`: etcd, kube-apiserver,
  kube-controller-manager, the two kube-schedulers, kwok; the API client the tests use.
- :mod:`hami.dev.schedconfig` — the kube-scheduler configuration documents (extender).
- :mod:`hami.dev.kwok` — the fake nodes: kwok's configuration and the Node manifest.
- :mod:`hami.dev.realnode` — one real node (kubelet + containerd + runc) beside the fake ones;
  :mod:`hami.dev.nodehost` what it puts on the host (and takes away), :mod:`hami.dev.nodeconfig`
  its configuration documents.
- :mod:`hami.dev.process` — child processes (log file, die with the parent, stop a group).
- :mod:`hami.dev.binaries` — where the pinned binaries live.
- :mod:`hami.dev.pki` — certificates; :mod:`hami.dev.errors` — the errors.
"""

from hami.dev.binaries import (
    KUBE_VERSION,
    OPTIONAL_BINARIES,
    REQUIRED_BINARIES,
    MissingBinaries,
    bin_dir,
    cache_dir,
    find_binaries,
)
from hami.dev.controlplane import START_TIMEOUT_S, KubeCluster, running_cluster
from hami.dev.errors import ApiError, ClusterError
from hami.dev.kwok import DEFAULT_NODE_ALLOCATABLE, KWOK_ANNOTATION, node_manifest
from hami.dev.process import STOP_TIMEOUT_S, Component, die_with_parent, free_port
from hami.dev.schedconfig import (
    DEFAULT_MANAGED_RESOURCES,
    DEFAULT_SCHEDULER,
    HAMI_SCHEDULER_NAME,
    ExtenderConfig,
    SchedulerConfig,
)

__all__ = [
    "KUBE_VERSION", "OPTIONAL_BINARIES", "REQUIRED_BINARIES", "MissingBinaries", "bin_dir", "cache_dir",
    "find_binaries", "START_TIMEOUT_S", "KubeCluster", "running_cluster", "ApiError", "ClusterError",
    "DEFAULT_NODE_ALLOCATABLE", "KWOK_ANNOTATION", "node_manifest", "STOP_TIMEOUT_S", "Component",
    "die_with_parent", "free_port", "DEFAULT_MANAGED_RESOURCES", "DEFAULT_SCHEDULER", "HAMI_SCHEDULER_NAME",
    "ExtenderConfig", "SchedulerConfig",
]
