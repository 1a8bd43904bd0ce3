"""Regression review of the monitor's finished init containers: only one that ran to its end
(exit code 0) is done; one that failed is run again by the kubelet (pod restartPolicy Always or
OnFailure) and still holds its GPU's limit."""

from __future__ import annotations

from types import SimpleNamespace as NS

from hami.monitor.kube import finished_init_containers


def _pod(*statuses, sidecars=(), restart="Never"):
    spec = NS(
        restart_policy=restart,
        init_containers=[NS(name=n, restart_policy="Always", restart_policy_rules=None) for n in sidecars],
        containers=[NS(name="main", restart_policy=None, restart_policy_rules=None)],
    )
    return NS(spec=spec, status=NS(init_container_statuses=list(statuses)))


def _terminated(name, code):
    return NS(name=name, state=NS(terminated=NS(exit_code=code), waiting=None, running=None))


def test_a_failed_init_container_is_not_finished():
    pod = _pod(_terminated("setup", 0), _terminated("fetch", 1), _terminated("side", 0), sidecars=("side",))
    assert finished_init_containers(pod) == frozenset({"setup"})  # was {"setup", "fetch"}


def test_init_containers_that_may_run_again_are_never_finished():
    """Found by review, 1 Dec: the kubelet runs a pod's init containers again, with their grants,
    after a new sandbox (restartPolicy Always or OnFailure) or when a RestartAllContainers rule
    fires; the scheduler keeps their grants, so the monitor keeps their series."""
    for restart in ("Always", "OnFailure", None):
        assert finished_init_containers(_pod(_terminated("setup", 0), restart=restart)) == frozenset()
    pod = _pod(_terminated("setup", 0))
    assert finished_init_containers(pod) == frozenset({"setup"})
    pod.spec.containers[0].restart_policy_rules = [NS(action="RestartAllContainers")]
    assert finished_init_containers(pod) == frozenset()
