"""The ``KubeSchedulerConfiguration`` documents of the harness's kube-scheduler processes.

:class:`ExtenderConfig` is one ``extenders`` entry (HAMi's values by default);
:class:`SchedulerConfig` is a whole process: profile name, extender, leader election, client
rate limits.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HAMI_SCHEDULER_NAME = "hami-scheduler"
DEFAULT_MANAGED_RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpucores",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/priority",
)
_DURATION = re.compile(r"^\d+(\.\d+)?(ms|s|m|h)$")


@dataclass(frozen=True)
class ExtenderConfig:
    """One ``extenders`` entry of a ``KubeSchedulerConfiguration`` (HAMi's values by default).

    ``url_prefix`` is ``http://`` or ``https://host:port[/path]``; with ``https`` the scheduler
    trusts ``ca_pem`` if given, else the cluster CA, unless ``tls_insecure`` is set.
    """

    url_prefix: str
    filter_verb: str = "filter"
    bind_verb: str | None = "bind"
    prioritize_verb: str | None = None
    node_cache_capable: bool = True
    managed_resources: tuple[str, ...] = DEFAULT_MANAGED_RESOURCES
    ignored_by_scheduler: bool = True
    http_timeout: str = "30s"
    weight: int = 1
    ignorable: bool = False
    tls_insecure: bool = False
    ca_pem: bytes | None = None

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.url_prefix):
            raise ValueError(f"extender url_prefix: expected http(s)://host:port, got {self.url_prefix!r}")
        if not _DURATION.match(self.http_timeout):
            raise ValueError(f"extender http_timeout: expected a duration like '30s', got {self.http_timeout!r}")
        if not self.filter_verb:
            raise ValueError(f"extender filter_verb: must not be empty, got {self.filter_verb!r}")
        bad = [name for name in self.managed_resources if not name or "/" not in name]
        if bad:
            raise ValueError(f"extender managed_resources: expected domain/name, got {bad!r}")

    @property
    def https(self) -> bool:
        return self.url_prefix.startswith("https://")

    def document(self, cluster_ca_pem: bytes | None = None) -> dict[str, Any]:
        """The ``extenders`` list entry, as kube-scheduler reads it."""
        doc: dict[str, Any] = {
            "urlPrefix": self.url_prefix,
            "filterVerb": self.filter_verb,
            "nodeCacheCapable": self.node_cache_capable,
            "weight": self.weight,
            "httpTimeout": self.http_timeout,
            "enableHTTPS": self.https,
            "ignorable": self.ignorable,
            "managedResources": [
                {"name": name, "ignoredByScheduler": self.ignored_by_scheduler} for name in self.managed_resources
            ],
        }
        if self.bind_verb:
            doc["bindVerb"] = self.bind_verb
        if self.prioritize_verb:
            doc["prioritizeVerb"] = self.prioritize_verb
        if self.https:
            ca = self.ca_pem or cluster_ca_pem
            doc["tlsConfig"] = (
                {"insecure": True} if self.tls_insecure or not ca else {"caData": base64.b64encode(ca).decode()}
            )
        return doc


@dataclass(frozen=True)
class SchedulerConfig:
    """How the HAMi kube-scheduler process runs: its profile name, extender, leader election."""

    scheduler_name: str = HAMI_SCHEDULER_NAME
    extender: ExtenderConfig | None = None
    leader_elect: bool = False
    lease_name: str = HAMI_SCHEDULER_NAME
    lease_namespace: str = "kube-system"
    #: ``clientConnection.qps``/``burst``, as the chart sets them: high enough that the API
    #: server, not kube-scheduler's client, limits the rate (kube-scheduler's own defaults, 50/100,
    #: which None keeps, cap its calls - a Binding per GPU-less pod, an event per pod - near 50
    #: pods/s).
    client_qps: float | None = 1000.0
    client_burst: int | None = 2000

    def document(self, kubeconfig: Path, cluster_ca_pem: bytes | None = None) -> dict[str, Any]:
        """The ``KubeSchedulerConfiguration`` for this process."""
        connection: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
        if self.client_qps is not None:
            connection["qps"] = self.client_qps
        if self.client_burst is not None:
            connection["burst"] = self.client_burst
        doc: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": connection,
            "leaderElection": {
                "leaderElect": self.leader_elect,
                "resourceName": self.lease_name,
                "resourceNamespace": self.lease_namespace,
            },
            "profiles": [{"schedulerName": self.scheduler_name}],
        }
        if self.extender:
            doc["extenders"] = [self.extender.document(cluster_ca_pem)]
        return doc


DEFAULT_SCHEDULER = SchedulerConfig(scheduler_name="default-scheduler", lease_name="kube-scheduler")
