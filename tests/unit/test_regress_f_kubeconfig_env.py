"""A $KUBECONFIG naming no file that exists (found by a regression review of the CLI's quieter
start-up): the client library's "Config not found: <path>" warning was silenced so that a missing
--kubeconfig reads as one line, and with it the only word about a mistyped $KUBECONFIG. Outside a
pod the line said "Service host/port is not set" (the in-cluster fallback's complaint); in a pod
the pod's service account was used instead, silently."""

from __future__ import annotations

import asyncio
import logging

import pytest
from kubernetes_asyncio import config
from kubernetes_asyncio.config import kube_config

from hami.kube import client as kube_client


@pytest.fixture
def typo(tmp_path, monkeypatch):
    missing = str(tmp_path / "no-such-kubeconfig")
    monkeypatch.setenv("KUBECONFIG", missing)
    # the library reads $KUBECONFIG once, at import
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", missing)
    return missing


def test_outside_a_pod_the_error_names_the_missing_kubeconfig(typo, monkeypatch):
    def not_in_a_pod(**_kw):
        raise config.ConfigException("Service host/port is not set.")

    monkeypatch.setattr(config, "load_incluster_config", not_in_a_pod)
    with pytest.raises(config.ConfigException) as err:
        asyncio.run(kube_client.load_api_client(None))
    assert f"KUBECONFIG={typo!r}: no such file" in str(err.value)
    assert "not in a pod" in str(err.value)


def test_in_a_pod_the_fallback_to_the_service_account_is_said(typo, monkeypatch, caplog):
    monkeypatch.setattr(config, "load_incluster_config", lambda **_kw: None)
    caplog.set_level(logging.WARNING, logger=kube_client.__name__)

    async def load():
        api = await kube_client.load_api_client(None)
        await api.close()

    asyncio.run(load())
    (line,) = [r.getMessage() for r in caplog.records if r.name == kube_client.__name__]
    assert typo in line and "service account" in line


def test_an_unset_kubeconfig_falls_back_without_a_word(tmp_path, monkeypatch, caplog):
    # the usual pod: no $KUBECONFIG, no ~/.kube/config; nothing to warn of
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "absent"))
    monkeypatch.setattr(config, "load_incluster_config", lambda **_kw: None)
    caplog.set_level(logging.WARNING)

    async def load():
        api = await kube_client.load_api_client(None)
        await api.close()

    asyncio.run(load())
    assert not [r for r in caplog.records if r.name == kube_client.__name__]
