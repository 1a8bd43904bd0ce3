"""The chart's part of the web UI's sign-in (issue 27, item 1), rendered with `helm template`:

- ``scheduler.ui.auth: token`` (the default with ``scheduler.ui.enabled``): ``--ui-auth=token``
  on ``0.0.0.0``, the Service, and a ClusterRole of its own with exactly ``create`` on
  tokenreviews and subjectaccessreviews (system:auth-delegator's two rules, nothing more) bound
  to the scheduler's ServiceAccount; the scheduler's main role gains nothing.
- ``none``: a loopback bind, ``--ui-auth=none``, no Service and no review role.
- any other value fails the render naming the value.
The rendered arguments are parsed by the scheduler's own option parser, so the chart can never
ship a combination the scheduler refuses. The RBAC is exercised for real in test_ui_auth.py.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path

import pytest
import yaml

from hami.scheduler import options as O

from .test_chart import CHART, KUBE_VERSION

pytestmark = pytest.mark.integration

REVIEW_RULES = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]


def _render(helm_bin, *args: str) -> dict[tuple[str, str], dict]:  # noqa: F811
    out = helm_bin("template", "hami", str(CHART), "--namespace", "gpu", "--kube-version", KUBE_VERSION, *args).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}


def _scheduler_args(docs: dict) -> list[str]:
    dep = docs[("Deployment", "hami-scheduler")]
    ctr = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vgpu-scheduler-extender")
    return [a for a in ctr["command"] if a.startswith("--")]


@functools.cache
def _pod_files() -> dict[str, str]:
    """A certificate and key standing in for the pod's mounted ones (the parser reads them)."""
    from hami_devkit.pki import CertificateAuthority

    pair = CertificateAuthority("chart-test-ca").issue("ui", hosts=("127.0.0.1",))
    d = Path(tempfile.mkdtemp(prefix="hami-ui-tls-"))
    (d / "tls.crt").write_bytes(pair.cert_pem)
    (d / "tls.key").write_bytes(pair.key_pem)
    return {"tls.crt": str(d / "tls.crt"), "tls.key": str(d / "tls.key")}


def _parsed(args: list[str]) -> O.Options:
    """The UI flags of the rendered command line, through the scheduler's own parser (the other
    flags name files of the pod: the certificate, the device config); the UI's certificate files
    are read from stand-ins of the same names."""
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    ui = [a for a in args if a.startswith("--ui-")]
    ui = [
        a.split("=", 1)[0] + "=" + _pod_files()[a.rsplit("/", 1)[1]] if a.startswith(("--ui-cert", "--ui-key")) else a
        for a in ui
    ]
    return O.options_from_args(parser.parse_args(ui))


def _review_grants(docs: dict) -> list[dict]:
    """Every rule of any role that names a review resource."""
    return [
        rule
        for (kind, _), d in docs.items()
        if kind in ("ClusterRole", "Role")
        for rule in d.get("rules") or []
        if {"tokenreviews", "subjectaccessreviews"} & set(rule.get("resources") or [])
    ]


def test_token_sign_in_gets_exactly_the_two_review_rules(helm_bin):  # noqa: F811
    docs = _render(helm_bin, "--set", "scheduler.ui.enabled=true")
    args = _scheduler_args(docs)
    assert "--ui-bind=0.0.0.0:9090" in args and "--ui-auth=token" in args
    opts = _parsed(args)
    assert (opts.ui_host, opts.ui_port, opts.ui_auth) == ("0.0.0.0", 9090, "token")
    role = docs[("ClusterRole", "hami-scheduler-ui-auth")]
    assert role["rules"] == REVIEW_RULES
    binding = docs[("ClusterRoleBinding", "hami-scheduler-ui-auth")]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "hami-scheduler-ui-auth",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hami-scheduler", "namespace": "gpu"}]
    assert _review_grants(docs) == REVIEW_RULES  # nowhere else, and not in the scheduler's main role
    assert ("Service", "hami-scheduler-ui") in docs
    # the review rights are the only difference the sign-in makes to the RBAC, besides the UI's
    # `list events` in the scheduler's main role (a pod page's events, docs/ui.md)
    off = _render(helm_bin)
    rbac = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    added = {k for k in docs if k[0] in rbac} - {k for k in off if k[0] in rbac}
    assert added == {("ClusterRole", "hami-scheduler-ui-auth"), ("ClusterRoleBinding", "hami-scheduler-ui-auth")}
    on_rules, off_rules = (
        docs[("ClusterRole", "hami-scheduler")]["rules"],
        off[("ClusterRole", "hami-scheduler")]["rules"],
    )
    assert [r for r in on_rules if r not in off_rules] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}
    ]
    assert all(r in on_rules for r in off_rules)


def test_no_review_rights_while_the_ui_is_off_or_without_sign_in(helm_bin):  # noqa: F811
    off = _render(helm_bin)
    assert _review_grants(off) == [] and not [a for a in _scheduler_args(off) if a.startswith("--ui-")]
    none = _render(helm_bin, "--set", "scheduler.ui.enabled=true", "--set", "scheduler.ui.auth=none")
    args = _scheduler_args(none)
    assert "--ui-bind=127.0.0.1:9090" in args and "--ui-auth=none" in args
    assert _parsed(args).ui_auth == "none"  # accepted: loopback
    assert _review_grants(none) == []
    assert ("Service", "hami-scheduler-ui") not in none  # a Service cannot reach the pod's loopback


def test_an_unknown_auth_mode_fails_the_render(helm_bin):  # noqa: F811
    result = helm_bin(
        "template",
        "hami",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "scheduler.ui.enabled=true",
        "--set",
        "scheduler.ui.auth=basic",
        check=False,
    )
    assert result.returncode != 0
    assert 'scheduler.ui.auth: expected token or none, got "basic"' in result.stderr


def test_path_prefix_and_frame_ancestors_come_from_values(helm_bin):  # noqa: F811
    """Issue 27, item 5: scheduler.ui.pathPrefix / frameAncestors become the flags, read back by the
    scheduler's parser; by default neither flag is written (root path, frame-ancestors 'none')."""
    default = _scheduler_args(_render(helm_bin, "--set", "scheduler.ui.enabled=true"))
    assert not [a for a in default if a.startswith(("--ui-path-prefix", "--ui-frame-ancestors"))]
    assert (_parsed(default).ui_path_prefix, _parsed(default).ui_frame_ancestors) == ("", "'none'")
    args = _scheduler_args(
        _render(
            helm_bin,
            "--set",
            "scheduler.ui.enabled=true",
            "--set",
            "scheduler.ui.pathPrefix=/tools/gpus",
            "--set",
            "scheduler.ui.frameAncestors='self' https://portal.example.com",
        )
    )
    opts = _parsed(args)
    assert opts.ui_path_prefix == "/tools/gpus"
    assert opts.ui_frame_ancestors == "'self' https://portal.example.com"


@pytest.mark.parametrize("bad", ["'self'; script-src *", "https://a.example, https://b.example"])
def test_a_frame_ancestors_value_that_ends_the_directive_fails_the_render(helm_bin, bad):  # noqa: F811
    result = helm_bin(
        "template",
        "hami",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "scheduler.ui.enabled=true",
        "--set-string",
        "scheduler.ui.frameAncestors=" + bad.replace(",", "\\,"),  # --set splits on an unescaped comma
        check=False,
    )
    assert result.returncode != 0 and "scheduler.ui.frameAncestors" in result.stderr


def _mounts(docs: dict) -> tuple[dict[str, str], dict[str, dict]]:
    dep = docs[("Deployment", "hami-scheduler")]
    spec = dep["spec"]["template"]["spec"]
    ctr = next(c for c in spec["containers"] if c["name"] == "vgpu-scheduler-extender")
    return {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}, {v["name"]: v for v in spec["volumes"]}


def test_the_ui_is_https_with_the_serving_certificate_by_default(helm_bin):  # noqa: F811
    """Issue 27, item 1: with sign-in the UI listener serves HTTPS; by default with the scheduler's
    serving certificate (the webhook's Secret, already mounted at /tls)."""
    docs = _render(helm_bin, "--set", "scheduler.ui.enabled=true")
    args = _scheduler_args(docs)
    assert "--ui-cert-file=/tls/tls.crt" in args and "--ui-key-file=/tls/tls.key" in args
    assert "--ui-plain-http" not in args
    mounts, volumes = _mounts(docs)
    assert mounts["tls"] == "/tls" and volumes["tls"]["secret"]["secretName"] == "hami-scheduler-tls"
    assert "ui-tls" not in mounts
    opts = _parsed(args)
    assert opts.ui_cert_file.endswith("tls.crt") and opts.ui_key_file.endswith("tls.key")


def test_the_ui_can_have_a_certificate_of_its_own(helm_bin):  # noqa: F811
    docs = _render(helm_bin, "--set", "scheduler.ui.enabled=true", "--set", "scheduler.ui.tls.secretName=gpu-ui-cert")
    args = _scheduler_args(docs)
    assert "--ui-cert-file=/ui-tls/tls.crt" in args and "--ui-key-file=/ui-tls/tls.key" in args
    mounts, volumes = _mounts(docs)
    assert mounts["ui-tls"] == "/ui-tls"
    assert volumes["ui-tls"]["secret"] == {
        "secretName": "gpu-ui-cert",
        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
    }
    assert _parsed(args).ui_cert_file.endswith("tls.crt")
    # with cert-manager on, the serving certificate the UI uses by default is cert-manager's
    cm = _render(helm_bin, "--set", "scheduler.ui.enabled=true", "--set", "scheduler.certManager.enabled=true")
    assert "--ui-cert-file=/tls/tls.crt" in _scheduler_args(cm)
    assert ("Certificate", "hami-scheduler-serving") in cm


def test_plain_http_only_when_asked_or_on_loopback(helm_bin):  # noqa: F811
    plain = _scheduler_args(
        _render(helm_bin, "--set", "scheduler.ui.enabled=true", "--set", "scheduler.ui.tls.enabled=false")
    )
    assert "--ui-plain-http" in plain and not [a for a in plain if a.startswith("--ui-cert-file")]
    assert _parsed(plain).ui_cert_file == ""
    none = _render(helm_bin, "--set", "scheduler.ui.enabled=true", "--set", "scheduler.ui.auth=none")
    args = _scheduler_args(none)
    assert not [a for a in args if a.startswith(("--ui-cert-file", "--ui-plain-http"))]  # loopback: plain
    assert "ui-tls" not in _mounts(none)[0]
    # without a TLS flag a non-loopback bind is refused by the scheduler: the chart never renders that
    with pytest.raises(O.ConfigError, match="needs HTTPS"):
        _parsed(["--ui-bind=0.0.0.0:9090", "--ui-auth=token"])
