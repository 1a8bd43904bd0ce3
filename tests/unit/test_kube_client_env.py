"""kubernetes_asyncio's session re-reads proxy variables and ~/.netrc on every request; we turn
that off only when no proxy variable is set (a set one must still be honoured)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from hami.kube.client import skip_env_lookups


@pytest.mark.parametrize("var", [None, "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "NO_PROXY"])
async def test_env_lookups_stay_on_only_when_a_proxy_variable_is_set(monkeypatch, var):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    if var:
        monkeypatch.setenv(var, "http://proxy.example:3128")
    api = skip_env_lookups(client.ApiClient())
    try:
        assert api.rest_client.pool_manager._trust_env is bool(var)
    finally:
        await api.close()


@pytest.mark.parametrize("text", ["", "- a\n- b\n"])
async def test_a_kubeconfig_that_is_not_one_is_a_config_error_naming_the_file(tmp_path, text):
    """The client read an empty file (or a list) with a TypeError, which the CLI showed as a traceback."""
    from kubernetes_asyncio.config import ConfigException

    from hami.kube.client import load_api_client

    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(ConfigException, match=f"{path}: not a kubeconfig"):
        await load_api_client(str(path))
