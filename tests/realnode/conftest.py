"""Fixtures for tests on a real node (kubelet + containerd + runc); see docs/testing.md.

``real_cluster`` (session) -> a :class:`hami_devkit.cluster.KubeCluster` of its own (not the
integration tests' one, whose kwok-only tests must not see a node that really runs pods).

``real_node`` (function scope, one node per session) -> the running
:class:`hami_devkit.realnode.RealNode` named ``hami-real-node``, labelled ``gpu=on``, with the
pause and busybox images imported (``BUSYBOX`` is the busybox image's ref). The node starts on
first use and stays up for the session; a test that stops it (``real_node_holder.stop()``)
gets a fresh one the next time a test asks. Useful members: ``name``, ``containerd_socket``,
``kubelet_root``, ``pod_logs_dir``, ``log_path("kubelet"|"containerd")``, ``import_image``,
``ctr(...)``, ``stop()``.

If another test session holds this machine's real node, the fixture waits for it (up to
``LOCK_WAIT_S``). When the machine cannot run a real node (not root, packages or the kubelet missing), every test
that asks for it is skipped with one line naming what is missing; with
``HAMI_REQUIRE_REAL_NODE=1`` (CI) it fails instead.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest

from hami_devkit.cluster import KubeCluster, MissingBinaries, find_binaries
from hami_devkit.realnode import RealNode, RealNodeUnavailable, missing_requirements

_state: dict[str, object] = {}
LOCK_WAIT_S = 900.0


def _unavailable(reason: str) -> None:
    if os.environ.get("HAMI_REQUIRE_REAL_NODE") == "1":
        pytest.fail(f"HAMI_REQUIRE_REAL_NODE=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest):
    """A control plane for the real-node tests (its own, see the module docstring)."""
    try:
        binaries = find_binaries()
    except MissingBinaries as exc:
        _unavailable(str(exc))
    missing = missing_requirements(binaries)
    if missing:
        _unavailable(str(RealNodeUnavailable(missing)))
    # no HAMi kube-scheduler process: the chart installed on the real node brings its own
    # (tests/realnode/test_chart_e2e.py); the API server also listens on the node's address,
    # where the real node's pods reach it through the kubernetes Service (hami_devkit.kubeproxy)
    cluster = KubeCluster(hami_scheduler=None, apiserver_bind_address="0.0.0.0")
    cluster.start()
    _state["cluster"] = cluster
    try:
        yield cluster
    finally:
        failed = request.session.testsfailed > 0
        cluster.stop(keep_logs=failed)


class RealNodeHolder:
    """The session's real node, started on demand (so a test may stop it and the next get a new one)."""

    def __init__(self, cluster: KubeCluster) -> None:
        from hami_devkit.images import build_busybox_image, build_pause_image

        self.cluster = cluster
        self.pause = build_pause_image()
        self.busybox = build_busybox_image()
        self.node: RealNode | None = None
        self.lock_wait = LOCK_WAIT_S
        self.bringups: list[float] = []

    def get(self) -> RealNode:
        if self.node is None:
            # another checkout's tests may hold this machine's real node for a while: wait for it
            self.node = RealNode(
                self.cluster, pause_image=self.pause, images=[self.busybox.path], lock_wait=self.lock_wait
            ).start()
            self.bringups.append(self.node.startup_seconds)
            _state["node"] = self.node
        return self.node

    def stop(self, keep_workdir: bool = False) -> list[str]:
        node, self.node = self.node, None
        if node is None:
            return []
        problems = node.stop(keep_workdir=keep_workdir)
        if keep_workdir:
            _state["kept"] = node.workdir
        return problems


@pytest.fixture(scope="session")
def real_node_holder(real_cluster: KubeCluster, request: pytest.FixtureRequest):
    holder = RealNodeHolder(real_cluster)
    _state["holder"] = holder
    try:
        yield holder
    finally:
        problems = holder.stop(keep_workdir=request.session.testsfailed > 0)  # logs for the failure
        if problems:
            raise AssertionError("real node teardown left: " + "; ".join(problems))


@pytest.fixture
def real_node(real_node_holder: RealNodeHolder) -> RealNode:
    return real_node_holder.get()


@pytest.fixture
def busybox(real_node_holder: RealNodeHolder) -> str:
    """The busybox image's ref (imported into every real node the holder starts)."""
    return real_node_holder.busybox.ref


@pytest.fixture
def real_namespace(real_cluster: KubeCluster, request: pytest.FixtureRequest):
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base or 't'}-{uuid.uuid4().hex[:6]}"
    real_cluster.create_namespace(name)
    yield name
    real_cluster.delete_namespace(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    node = _state.get("node")
    if report.failed and node is not None and "real_node" in getattr(item, "fixturenames", ()):
        report.sections.append(("real node logs (last lines)", node.log_tails(40)))
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    holder = _state.get("holder")
    if holder is not None and holder.bringups:
        figures = ", ".join(f"{seconds:.1f}s" for seconds in holder.bringups)
        terminalreporter.write_line(f"real node bring-up (to Ready): {figures}")
    if "kept" in _state:
        terminalreporter.write_line(f"real node work directory (logs) kept in {_state['kept']}")
