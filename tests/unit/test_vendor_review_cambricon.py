"""Cambricon's own device plugin (dynamic-smlu mode) finds the pod it must serve by
``CAMBRICON_DSMLU_ASSIGHED == "false"`` (its spelling, which HAMi also wrote until it fixed the
typo). Found by an adversarial review: we wrote only ``CAMBRICON_DSMLU_ASSIGNED``, so the plugin
never saw the pod, its Allocate failed and the node lock stayed until it expired."""

from __future__ import annotations

from ._vendorkit import ctr, node, one, pod

VMLU, VMEM, VCORE = "cambricon.com/vmlu", "cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu.smlu.vcore"


def test_the_plugins_spelling_of_the_assigned_mark_is_written():
    mlu = node("mlu-1", capacity={VCORE: 200, VMEM: 768})
    r = one([mlu], pod("p", [ctr(limits={VMLU: 1, VMEM: 4, VCORE: 10})]))
    assert r.annotations["CAMBRICON_DSMLU_ASSIGHED"] == "false"  # what the plugin reads
    assert r.annotations["CAMBRICON_DSMLU_ASSIGNED"] == "false"  # what HAMi writes today
    assert r.annotations["CAMBRICON_DSMLU_PROFILE"] == "0_10_4"


def test_the_plugins_spelling_is_internal_to_the_scheduler():
    """A pod created with the mark (e.g. "false" to have the plugin serve a pod hami did not
    place) has it removed by the webhook, as the HAMi spelling is."""
    from hami.vendors import CambriconVendor

    assert "CAMBRICON_DSMLU_ASSIGHED" in CambriconVendor().decision_annotations
