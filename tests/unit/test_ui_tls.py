"""The UI listener over HTTPS (issue 27, item 1): --ui-cert-file/--ui-key-file, the rule that a
non-loopback UI is HTTPS unless --ui-plain-http says TLS ends in front of it, and the listener
serving the page and a signed-in /api/v1 with the certificate (reloaded when it is renewed)."""

from __future__ import annotations

import argparse
import asyncio
import re
import ssl

import pytest
from aiohttp import ClientConnectionError, ClientSession, TCPConnector

from hami.core.errors import ConfigError
from hami.scheduler import options as O
from hami.serve import CertReloader
from hami.ui.auth import Authorizer
from hami.ui.server import UiApi, serve_ui
from hami_devkit.pki import CertificateAuthority

from .test_ui_auth import ADMIN, FakeReviews
from .test_ui_auth import shared as _shared_state

shared = _shared_state


def _args(*argv):
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def pki(tmp_path):
    ca = CertificateAuthority("ui-ca")
    files = {"ca.crt": tmp_path / "ca.crt"}
    files["ca.crt"].write_bytes(ca.pair.cert_pem)
    for name in ("tls", "renewed"):
        pair = ca.issue(name, hosts=("127.0.0.1", "localhost"))
        files[f"{name}.crt"], files[f"{name}.key"] = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
        files[f"{name}.crt"].write_bytes(pair.cert_pem)
        files[f"{name}.key"].write_bytes(pair.key_pem)
    return {k: str(v) for k, v in files.items()}


def test_a_network_facing_ui_needs_https_or_an_explicit_plain_http():
    with pytest.raises(ConfigError) as err:
        O.options_from_args(_args("--ui-bind", "0.0.0.0:9090"))
    text = str(err.value)
    assert text.startswith("--ui-bind: '0.0.0.0:9090' is not a loopback address")
    assert "--ui-cert-file" in text and "--ui-key-file" in text and "--ui-plain-http" in text
    opts = O.options_from_args(_args("--ui-bind", "0.0.0.0:9090", "--ui-plain-http"))
    assert opts.ui_cert_file == ""
    for host in ("127.0.0.1", "[::1]", "localhost"):  # kubectl port-forward: plain HTTP on loopback
        for auth in ("token", "none"):
            assert O.options_from_args(_args("--ui-bind", f"{host}:9090", "--ui-auth", auth)).ui_port == 9090


def test_https_flags(pki):
    opts = O.options_from_args(
        _args("--ui-bind", "0.0.0.0:9090", "--ui-cert-file", pki["tls.crt"], "--ui-key-file", pki["tls.key"])
    )
    assert (opts.ui_cert_file, opts.ui_key_file) == (pki["tls.crt"], pki["tls.key"])


@pytest.mark.parametrize(
    "extra, text",
    [
        (["--ui-cert-file", "{tls.crt}"], "--ui-cert-file and --ui-key-file go together"),
        (["--ui-cert-file", "/nonexistent.crt", "--ui-key-file", "{tls.key}"], "--ui-cert-file: no such file"),
        (["--ui-cert-file", "{tls.crt}", "--ui-key-file", "/nonexistent.key"], "--ui-key-file: no such file"),
        (["--ui-cert-file", "{tls.crt}", "--ui-key-file", "{renewed.key}"], "are not a usable pair"),
        (["--ui-cert-file", "{tls.crt}", "--ui-key-file", "{tls.key}", "--ui-plain-http"], "--ui-plain-http: given"),
    ],
)
def test_bad_tls_flags_are_named(pki, extra, text):
    argv = [re.sub(r"\{(.+)\}", lambda m: pki[m.group(1)], a) for a in extra]
    with pytest.raises(ConfigError, match=re.escape(text)):
        O.options_from_args(_args("--ui-bind", "0.0.0.0:9090", *argv))


@pytest.mark.parametrize("flag", [["--ui-plain-http"], ["--ui-cert-file", "x.crt"], ["--ui-key-file", "x.key"]])
def test_tls_flags_need_the_ui(flag):
    with pytest.raises(ConfigError, match=f"^{flag[0]}: .*only used with --ui-bind"):
        O.options_from_args(_args(*flag))


async def test_the_listener_serves_https_with_the_certificate_and_reloads_it(pki, shared):
    reloader = CertReloader(pki["tls.crt"], pki["tls.key"])
    api = UiApi(shared, "hami-scheduler", authorizer=Authorizer(FakeReviews()))
    runner = await serve_ui(api, "127.0.0.1", 0, ssl_context=reloader.context)
    port = runner.addresses[0][1]
    trust = ssl.create_default_context(cafile=pki["ca.crt"])
    try:
        async with ClientSession(connector=TCPConnector(ssl=trust)) as session:
            async with session.get(f"https://127.0.0.1:{port}/") as r:
                assert r.status == 200 and "static/app.js" in await r.text()
            async with session.get(f"https://127.0.0.1:{port}/api/v1/pods") as r:
                assert r.status == 401  # HTTPS changes nothing of the sign-in
            headers = {"Authorization": f"Bearer {ADMIN}"}
            async with session.get(f"https://127.0.0.1:{port}/api/v1/pods", headers=headers) as r:
                assert r.status == 200 and (await r.json())["items"]
        async with ClientSession() as session:  # plain HTTP on the TLS port: no answer
            with pytest.raises(ClientConnectionError):
                async with session.get(f"http://127.0.0.1:{port}/healthz") as r:
                    await r.read()
        untrusting = ssl.create_default_context()  # the system's CAs only: the handshake fails
        async with ClientSession(connector=TCPConnector(ssl=untrusting)) as session:
            with pytest.raises(ClientConnectionError):
                async with session.get(f"https://127.0.0.1:{port}/healthz") as r:
                    await r.read()
        # a renewed certificate (cert-manager, a rotated Secret) is served without a restart
        with open(pki["renewed.crt"], "rb") as f:
            renewed = f.read()
        with open(pki["renewed.key"], "rb") as f:
            renewed_key = f.read()
        with open(pki["tls.key"], "wb") as f:
            f.write(renewed_key)
        with open(pki["tls.crt"], "wb") as f:
            f.write(renewed)
        assert reloader.check() is True
        served = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
        assert served.strip() == renewed.decode().strip()
    finally:
        await runner.cleanup()
