"""The DRA webhook's memory of the ResourceClaimTemplates it created (hami.webhook.templates)."""

import pytest

from hami.webhook.templates import KnownTemplates


def test_a_template_is_known_until_its_ttl_runs_out():
    k = KnownTemplates(ttl=30)
    assert not k.known("ns", "t", now=0)
    k.exists("ns", "t", now=100)
    assert k.known("ns", "t", now=100) and k.known("ns", "t", now=129.9)
    assert not k.known("ns", "t", now=130)  # expired: the next admission sends its POST again
    assert len(k) == 0


def test_namespaces_are_apart_and_forget_drops_one():
    k = KnownTemplates(ttl=30)
    k.exists("a", "t", now=0)
    k.exists("b", "t", now=0)
    assert not k.known("c", "t", now=1)
    k.forget("a", "t")
    assert not k.known("a", "t", now=1) and k.known("b", "t", now=1)


def test_beyond_max_entries_the_oldest_is_forgotten_and_a_renewed_one_kept():
    k = KnownTemplates(ttl=30, max_entries=2)
    k.exists("ns", "old", now=0)
    k.exists("ns", "mid", now=1)
    k.exists("ns", "old", now=2)  # renewed: now the newest
    k.exists("ns", "new", now=3)
    assert len(k) == 2
    assert k.known("ns", "old", now=4) and k.known("ns", "new", now=4) and not k.known("ns", "mid", now=4)


@pytest.mark.parametrize("ttl, most", [(-1, 10), (30, 0)])
def test_bad_settings_are_refused_by_name(ttl, most):
    with pytest.raises(ValueError, match="KnownTemplates: ttl must be >= 0 and max_entries >= 1"):
        KnownTemplates(ttl=ttl, max_entries=most)
