"""Regression review of the monitor's finished init containers: only one that ran to its end
(exit code 0) is done; one that failed is run again by the kubelet (pod restartPolicy Always or
OnFailure) and still holds its GPU's limit."""

from __future__ import annotations

from types import SimpleNamespace as NS

from hami.monitor.kube import finished_init_containers


def _pod(*statuses, sidecars=()):
    spec = NS(init_containers=[NS(name=n, restart_policy="Always") for n in sidecars])
    return NS(spec=spec, status=NS(init_container_statuses=list(statuses)))


def _terminated(name, code):
    return NS(name=name, state=NS(terminated=NS(exit_code=code), waiting=None, running=None))


def test_a_failed_init_container_is_not_finished():
    pod = _pod(_terminated("setup", 0), _terminated("fetch", 1), _terminated("side", 0), sidecars=("side",))
    assert finished_init_containers(pod) == frozenset({"setup"})  # was {"setup", "fetch"}
