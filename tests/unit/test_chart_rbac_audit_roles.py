"""The scheduler's grants, audited against the calls its code makes (a least-privilege review of
the chart's identities). Each grant removed here was one no code used:

- ``watch`` on the leader Lease: kube-scheduler's leader election (client-go) and the extender's
  poll (src/hami/scheduler/leader.py) both GET and PUT it, neither watches;
- the Lease and the ``patch`` on the namespace's pods (the leader's role label) with
  ``scheduler.leaderElect=false``: the extender then neither reads a Lease nor labels its pod;
- ``events.k8s.io`` Events: the extender writes core v1 Events (src/hami/scheduler/events.py);
  kube-scheduler's own come with system:kube-scheduler;
- ``get`` on ResourceQuotas, ResourceClaims and ResourceSlices: the scheduler only lists and
  watches them (src/hami/scheduler/server.py's reflectors); ``hami explain`` runs with the user's
  kubeconfig.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"
SRC = Path(__file__).resolve().parents[2] / "src" / "hami"


def _helm() -> str:
    found = sorted(Path.home().glob(".cache/hami/kube/*/bin/helm"))
    assert found, "helm is installed by `make kube` (the tests' install step)"
    return str(found[-1])


def render(*sets: str) -> dict:
    args = [_helm(), "template", "x", str(CHART), "--namespace", "gpu", "--kube-version", "1.34.4"]
    args += ["-s", "templates/scheduler/rbac.yaml"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}


def grants(role: dict) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, over the role's rules."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"] or ():
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_the_leader_lease_is_read_and_renewed_never_watched():
    for sets in ((), ("scheduler.kubeScheduler.separatePod=true",), ("scheduler.kubeScheduler.enabled=false",)):
        docs = render(*sets)
        roles = [d for (kind, _), d in docs.items() if kind == "Role"]
        leases = [r for role in roles for r in role["rules"] if "leases" in r["resources"]]
        assert leases, sets
        for rule in leases:
            assert sorted(rule["verbs"]) == ["get", "update"], (sets, rule)
            assert rule.get("resourceNames"), (sets, rule)  # never any Lease of the namespace
    # the extender's own Lease code reads it by name and writes it whole: no watch to grant
    leader = (SRC / "scheduler" / "leader.py").read_text()
    assert "Reflector" not in leader and "watch=" not in leader


def test_without_leader_election_the_extender_gets_no_lease_and_no_pod_patch():
    for sets in (
        ("scheduler.leaderElect=false",),
        ("scheduler.leaderElect=false", "scheduler.kubeScheduler.enabled=false"),
    ):
        docs = render(*sets)
        assert ("Role", "x-hami-scheduler") not in docs, sets
        assert ("RoleBinding", "x-hami-scheduler") not in docs, sets
        # and nothing else lets it patch pods (decisionWrite binding: the decision rides on the Binding)
        assert "patch" not in grants(docs[("ClusterRole", "x-hami-scheduler")]).get(("", "pods"), set())
    # with it, the role label on its own pod (the Services select the leader by it)
    role = grants(render()[("Role", "x-hami-scheduler")])
    assert role[("", "pods")] == {"patch"} and role[("coordination.k8s.io", "leases")] == {"get", "update"}


def test_the_extender_writes_core_events_only():
    cluster = grants(render()[("ClusterRole", "x-hami-scheduler")])
    assert cluster[("", "events")] == {"create", "patch"}
    assert ("events.k8s.io", "events") not in cluster
    # what that rests on: no events.k8s.io call anywhere in the scheduler, webhook or UI
    for part in ("scheduler", "webhook", "ui"):
        for path in (SRC / part).rglob("*.py"):
            assert "events.k8s.io" not in path.read_text(), path


def test_what_the_scheduler_only_watches_it_may_not_get_by_name():
    cluster = grants(render()[("ClusterRole", "x-hami-scheduler")])
    for key in (("", "resourcequotas"), ("resource.k8s.io", "resourceclaims"), ("resource.k8s.io", "resourceslices")):
        assert cluster[key] == {"list", "watch"}, key
    # what it reads by name keeps its get: a pod (Bind's fresh read), a node (the lock), a namespace
    assert "get" in cluster[("", "pods")] and "get" in cluster[("", "nodes")]
    assert cluster[("", "namespaces")] == {"get"}
