"""Fixtures for tests against a real Kubernetes control plane (see docs/testing.md).

``kube_cluster`` (session scope) -> :class:`hami_devkit.cluster.KubeCluster`, started once per
test session: etcd, kube-apiserver, kube-controller-manager, kube-scheduler ``default-scheduler``,
kube-scheduler ``hami-scheduler`` (no extender until a test sets one), kwok. Skips the test,
naming the missing binaries, when ``scripts/install-kube.sh`` has not been run. Useful members:

- ``kubeconfig`` (admin kubeconfig path), ``server`` (https URL), ``env()`` (KUBECONFIG + PATH
  with the pinned kubectl/helm), ``binaries`` (name -> path), ``ca_pem`` / ``ca_bundle``;
- ``create_node(name, labels=, annotations=, allocatable=, gpus=, split_count=)`` -> a Ready
  kwok node (``nvidia.com/gpu`` = gpus x split_count), ``delete_node(name)``;
- ``configure_hami_scheduler(extender=ExtenderConfig(url_prefix=..., managed_resources=...,
  http_timeout=..., bind_verb=...))`` restarts the ``hami-scheduler`` kube-scheduler (only when
  the configuration changes; the last one set stays for later tests, so set what you need);
- ``server_ssl_context()`` / ``issue_server_cert()`` for a test HTTPS server the cluster
  trusts (webhooks, HTTPS extenders); ``ca_bundle`` for ``clientConfig.caBundle``;
- ``api(method, path, body)`` (sync JSON REST as admin, raises ``ApiError``), ``kubectl(...)``,
  ``wait_for(probe, what, timeout)``, ``logs(component)``, ``log_tails()``.

``kube_namespace`` (function scope) -> the name of a fresh namespace (with its ``default``
service account), labelled ``hami.io/test=<test name>``; deleted after the test.

``kube_api`` (async, function scope) -> a ``kubernetes_asyncio.client.ApiClient`` for the
admin kubeconfig, closed after the test.

When a test that uses the cluster fails, the ends of every component's log are attached to its
report; the start-up time is printed in the terminal summary.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid

import pytest
import pytest_asyncio

from hami_devkit.binaries import find_binaries
from hami_devkit.cluster import KubeCluster, MissingBinaries

_state: dict[str, object] = {}


def _sigterm_as_interrupt() -> None:
    """Turn SIGTERM into KeyboardInterrupt so fixtures tear down and no process is left behind."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def _raise(*_: object) -> None:
            raise KeyboardInterrupt("SIGTERM")

        signal.signal(signal.SIGTERM, _raise)


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest):
    """The session's control plane (see the module docstring for its API)."""
    _sigterm_as_interrupt()
    cluster = KubeCluster()
    try:
        cluster.start()
    except MissingBinaries as exc:
        pytest.skip(str(exc))
    _state["cluster"] = cluster
    try:
        yield cluster
    finally:
        failed = request.session.testsfailed > 0
        cluster.stop(keep_logs=failed)
        if failed:
            _state["kept"] = cluster.workdir


@pytest.fixture
def kube_namespace(kube_cluster: KubeCluster, request: pytest.FixtureRequest):
    """A fresh namespace for one test; its name is returned."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base or 't'}-{uuid.uuid4().hex[:6]}"
    kube_cluster.create_namespace(name, labels={"hami.io/test": base[:63] or "t"})
    yield name
    kube_cluster.delete_namespace(name)


@pytest_asyncio.fixture(loop_scope="function")
async def kube_api(kube_cluster: KubeCluster):
    """A kubernetes_asyncio ApiClient authenticated as the cluster admin."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kube_cluster.kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield api


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    cluster = _state.get("cluster")
    if report.failed and cluster is not None and "kube_cluster" in getattr(item, "fixturenames", ()):
        report.sections.append(("Kubernetes component logs (last lines)", cluster.log_tails(30)))
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    cluster = _state.get("cluster")
    if cluster is None:
        return
    terminalreporter.write_line(cluster.describe_startup())
    if "kept" in _state:
        terminalreporter.write_line(f"Kubernetes component logs kept in {_state['kept']}/logs")


@pytest.fixture(scope="module")
def helm_bin(tmp_path_factory):
    """`helm` with a home of its own per module: ``run(*args, extra_env=None, check=True)``."""
    try:
        binary = find_binaries().get("helm")
    except MissingBinaries as exc:
        pytest.skip(str(exc))
    if binary is None:
        pytest.skip("helm is not installed (scripts/install-kube.sh)")
    home = tmp_path_factory.mktemp("helm")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "c"),
        "HELM_CONFIG_HOME": str(home / "g"),
        "HELM_DATA_HOME": str(home / "d"),
    }

    def run(*args: str, extra_env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(binary), *args], env={**env, **(extra_env or {})}, text=True, capture_output=True, timeout=120
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    return run
