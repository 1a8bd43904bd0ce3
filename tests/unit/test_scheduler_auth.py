"""Who may call the scheduler's HTTP endpoints (docs/security.md "What is exposed where"):
the --http_bind port serves /filter and /bind to nobody beside a loopback listener, and only to
client certificates of --extender-client-ca otherwise; /webhook and the health checks stay open."""

from __future__ import annotations

import argparse
import json
import socket
import ssl

import pytest
from aiohttp import ClientConnectionError, ClientSession, TCPConnector

from hami.core.errors import ConfigError
from hami_devkit.pki import CertificateAuthority
from hami.scheduler import options as O
from hami.scheduler.options import Options
from hami.scheduler.server import SchedulerService, serve
from hami.serve import CertReloader


def _args(*argv):
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    return parser.parse_args(list(argv))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pki(tmp_path):
    """A serving CA + certificate, a client CA (kube-scheduler's) + a client certificate, and a
    client certificate from a CA the scheduler does not know."""
    serving, client_ca, stranger = (
        CertificateAuthority("serving-ca"),
        CertificateAuthority("client-ca"),
        CertificateAuthority("stranger-ca"),
    )
    files = {}
    for name, pem in (("ca.crt", serving.pair.cert_pem), ("client-ca.crt", client_ca.pair.cert_pem)):
        files[name] = tmp_path / name
        files[name].write_bytes(pem)
    for name, ca, kw in (
        ("tls", serving, {"hosts": ("127.0.0.1",)}),
        ("kube-scheduler", client_ca, {"server": False, "client": True}),
        ("stranger", stranger, {"server": False, "client": True}),
        # the serving CA's own client certificate is not kube-scheduler's either
        ("serving-client", serving, {"server": False, "client": True}),
    ):
        pair = ca.issue(name, **kw)
        files[f"{name}.crt"], files[f"{name}.key"] = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
        files[f"{name}.crt"].write_bytes(pair.cert_pem)
        files[f"{name}.key"].write_bytes(pair.key_pem)
    return {k: str(v) for k, v in files.items()}


# ------------------------------------------------------------------ flags


def test_a_network_facing_port_needs_a_loopback_extender_or_a_client_ca(pki):
    with pytest.raises(ConfigError) as err:
        O.options_from_args(
            _args("--http_bind=0.0.0.0:9443", f"--cert_file={pki['tls.crt']}", f"--key_file={pki['tls.key']}")
        )
    assert "--http_bind" in str(err.value) and "0.0.0.0:9443" in str(err.value)
    assert "--extender-bind" in str(err.value) and "--extender-client-ca" in str(err.value)
    beside = O.options_from_args(_args("--http_bind=0.0.0.0:9443", "--extender-bind=127.0.0.1:9080"))
    assert not beside.extender_on_main and beside.extender_client_ca == ""
    mtls = O.options_from_args(
        _args(
            "--http_bind=0.0.0.0:9443",
            f"--cert_file={pki['tls.crt']}",
            f"--key_file={pki['tls.key']}",
            f"--extender-client-ca={pki['client-ca.crt']}",
        )
    )
    assert mtls.extender_on_main and mtls.extender_client_ca == pki["client-ca.crt"]
    local = O.options_from_args(_args("--http_bind=127.0.0.1:8080"))  # a loopback port may serve them
    assert local.extender_on_main and local.extender_client_ca == ""


def test_bad_client_ca_settings_name_the_flag(pki, tmp_path):
    tls = (f"--cert_file={pki['tls.crt']}", f"--key_file={pki['tls.key']}")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        ((*tls, "--extender-bind=127.0.0.1:9080", f"--extender-client-ca={pki['client-ca.crt']}"), "--extender-bind"),
        ((f"--extender-client-ca={pki['client-ca.crt']}",), "--cert_file"),
        ((*tls, "--extender-client-ca=/nonexistent/ca.crt"), "no such file '/nonexistent/ca.crt'"),
        ((*tls, f"--extender-client-ca={garbage}"), "is not a PEM CA bundle"),
    ]
    for argv, text in cases:
        with pytest.raises(ConfigError) as err:
            O.options_from_args(_args(*argv))
        assert "--extender-client-ca" in str(err.value) and text in str(err.value), (argv, err.value)


# ------------------------------------------------------------------ the listener

REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "u1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": "ns",
        "object": {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    },
}
FILTER = {"Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}, "NodeNames": ["n1"]}
BIND = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "n1"}


def _client_context(pki, cert: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki["ca.crt"])
    if cert:
        context.load_cert_chain(pki[f"{cert}.crt"], pki[f"{cert}.key"])
    return context


async def _call(port: int, context: ssl.SSLContext | None, method: str, path: str, body=None) -> tuple[int, str]:
    scheme = "https" if context else "http"
    async with ClientSession(connector=TCPConnector(ssl=context if context else False)) as session:
        async with session.request(
            method, f"{scheme}://127.0.0.1:{port}{path}", data=None if body is None else json.dumps(body)
        ) as resp:
            return resp.status, await resp.text()


async def test_beside_a_loopback_listener_the_https_port_serves_no_filter_or_bind(pki):
    svc = SchedulerService(Options(), None)
    reloader = CertReloader(pki["tls.crt"], pki["tls.key"])
    port, loop_port = _free_port(), _free_port()
    public = await serve(svc, "127.0.0.1", port, reloader.context, extender=False)
    loopback = await serve(svc, "127.0.0.1", loop_port, None, webhook=False)
    try:
        ctx = _client_context(pki, None)
        for path, body in (("/filter", FILTER), ("/bind", BIND)):
            assert (await _call(port, ctx, "POST", path, body))[0] == 404, path
            # even a client certificate of another CA changes nothing: nothing is there
            assert (await _call(port, _client_context(pki, "stranger"), "POST", path, body))[0] == 404, path
        assert await _call(port, ctx, "GET", "/healthz") == (200, "ok")
        status, text = await _call(port, ctx, "POST", "/webhook", REVIEW)
        assert status == 200 and json.loads(text)["response"]["uid"] == "u1"
        # kube-scheduler's own listener answers (the extender protocol's Error: no pod in the cache)
        status, text = await _call(loop_port, None, "POST", "/filter", FILTER)
        assert status == 200 and json.loads(text)["Error"]
        assert (await _call(loop_port, None, "POST", "/webhook", REVIEW))[0] == 404
    finally:
        await public.cleanup()
        await loopback.cleanup()


async def test_with_a_client_ca_only_its_certificates_reach_filter_and_bind(pki):
    svc = SchedulerService(Options(), None)
    reloader = CertReloader(pki["tls.crt"], pki["tls.key"], client_ca=pki["client-ca.crt"])
    port = _free_port()
    public = await serve(svc, "127.0.0.1", port, reloader.context, client_cert=True)
    try:
        anonymous = _client_context(pki, None)
        for path, body in (("/filter", FILTER), ("/bind", BIND)):
            status, text = await _call(port, anonymous, "POST", path, body)
            assert status == 403 and "--extender-client-ca" in text, (path, status, text)
        # the API server calls /webhook with no client certificate; probes call the health checks
        status, text = await _call(port, anonymous, "POST", "/webhook", REVIEW)
        assert status == 200 and json.loads(text)["response"]["allowed"] is True
        assert await _call(port, anonymous, "GET", "/readyz") == (200, "ok")
        # a certificate from any other CA (the serving CA included) fails the handshake
        for cert in ("stranger", "serving-client"):
            with pytest.raises(ClientConnectionError):
                await _call(port, _client_context(pki, cert), "POST", "/filter", FILTER)
        kube_scheduler = _client_context(pki, "kube-scheduler")
        status, text = await _call(port, kube_scheduler, "POST", "/filter", FILTER)
        assert status == 200 and "Error" in json.loads(text)
        status, text = await _call(port, kube_scheduler, "POST", "/bind", BIND)
        assert status == 200 and "Error" in json.loads(text)
    finally:
        await public.cleanup()


# ------------------------------------------------------------------ Filter: real pods only


def _usage(svc, *nodes):
    return sum(m for n in nodes for _, _, m, _ in svc.state.ledger.device_usage(n))


async def test_a_filter_reserves_only_for_a_real_pending_pod_of_ours():
    from .test_scheduler_state import node, pod

    svc = SchedulerService(Options(), None)  # cache only: the watch's pods are all it knows
    svc.extender.record = False
    svc.state.node_handler.replace([node("n1", gpus=1), node("n2", gpus=1)])
    names = ["n1", "n2"]

    def filt(p):
        return svc.extender.filter({"Pod": p, "NodeNames": names})

    bound = pod("bound")
    bound["spec"]["nodeName"] = "n1"
    leaving = pod("leaving")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    done = pod("done", phase="Succeeded")
    for p in (bound, leaving, done):
        svc.state.put_pod(p)
    real = pod("real", mem=600)
    svc.state.put_pod(real)
    impostor = pod("real", mem=1000, uid="uid-forged")  # the right name, another UID
    no_uid = pod("x", mem=1000)
    del no_uid["metadata"]["uid"]
    cases = [
        (pod("ghost", mem=1000, uid="4f1c0ad6-0000-4000-8000-000000000001"), "does not exist"),
        (impostor, "does not exist"),
        (no_uid, "has no metadata.uid"),
        (bound, "already bound to node n1"),
        (leaving, "being deleted"),
        (done, "has finished (Succeeded)"),
    ]
    for p, text in cases:
        answer = await filt(p)
        assert text in answer["Error"] and "nothing is reserved" in answer["Error"], (p["metadata"], answer)
        assert answer["NodeNames"] is None
    assert _usage(svc, *names) == 0 and not svc.extender._decisions
    assert svc.extender.stats["filter_refused"] == len(cases)

    # the real pod: its own spec counts, not what the request claims, and a re-filter replaces
    forged = pod("real", mem=1000)  # same UID, a bigger request in the body
    for _ in range(3):
        answer = await filt(forged)
        assert answer["Error"] == "" and answer["NodeNames"] in (["n1"], ["n2"])
    assert _usage(svc, *names) == 600
    assert len(svc.state.ledger.pods()) == 1
