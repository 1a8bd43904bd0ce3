"""Regression review of the quota's pod peak (hami.core.usage.pod_peak): an init container that
takes more than one GPU holds all of them at once, as the webhook counts it (memreq x nums)."""

from __future__ import annotations

from hami.core import schedule_pod
from hami.core.types import ContainerKind as K
from hami.core.usage import pod_peak
from hami.webhook.admission import AdmissionSettings, _quota_excess

from . import _corekit as kit


def test_an_init_container_on_two_gpus_counts_both():
    # init 2 x 4000 MiB / 30 cores, then one app container of 1000 / 10: 8000 at once
    picks = [(0, "NVIDIA", "g0", 4000, 30), (0, "NVIDIA", "g1", 4000, 30), (1, "NVIDIA", "g0", 1000, 10)]
    assert pod_peak(picks, (K.INIT, K.APP), "NVIDIA") == (8000, 60)  # was (4000, 30)
    assert pod_peak(picks, (K.INIT, K.APP), "NVIDIA", app_only=True) == (1000, 10)


def test_the_scheduler_refuses_what_the_webhook_refuses_for_a_multi_gpu_init_container():
    led = kit.ledger(kit.node("n1", 2, mem=16000))
    led.set_quota("team", "q", {"limits.nvidia.com/gpumem": "6000"}, kit.CONFIG.vendors)
    p = kit.pod(
        "a", [kit.ctr("app", mem=1000, cores=10)], init=[kit.ctr("setup", gpu=2, mem=4000, cores=30)], ns="team"
    )
    assert _quota_excess(p, AdmissionSettings(kit.CONFIG.vendors), led.quota_room) != ""  # 8000 > 6000
    r = schedule_pod(p, None, led, kit.CONFIG, 0)
    assert r.node is None  # was placed: counted 4000, the init container holds 8000
    assert led.namespace_usage("team", "NVIDIA") == (0, 0)


def test_a_placed_multi_gpu_init_container_is_charged_in_full_and_given_back_in_full():
    led = kit.ledger(kit.node("n1", 2, mem=16000))
    led.set_quota("team", "q", {"limits.nvidia.com/gpumem": "9000"}, kit.CONFIG.vendors)
    p = kit.pod(
        "a", [kit.ctr("app", mem=1000, cores=10)], init=[kit.ctr("setup", gpu=2, mem=4000, cores=30)], ns="team"
    )
    r = schedule_pod(p, None, led, kit.CONFIG, 0)
    assert r.node == "n1", r.reasons()
    assert led.namespace_usage("team", "NVIDIA") == (8000, 60)  # was (4000, 30)
    led.remove_pod(r.allocation.key)
    assert led.namespace_usage("team", "NVIDIA") == (0, 0)


def test_confirm_keeps_the_namespace_charge_it_will_give_back():
    """``confirm`` swaps the reserved record for the written one when their per-device usage is
    the same, without taking the counts out and putting them back; the namespace charge is the
    pod's peak over its containers, which two records with the same per-device usage can
    disagree on. Removing the pod then gave back another amount: 4000 charged, 6000 given back,
    the namespace left at -2000 (2000 MiB more room than its quota, for ever)."""
    from hami.core.ledger import make_allocation
    from hami.core.types import ContainerDevice

    led = kit.ledger(kit.node("n1", 2, mem=16000))
    p = kit.pod(
        "a", [kit.ctr("app", gpu=2, mem=3000, cores=10)], init=[kit.ctr("setup", mem=3000, cores=10)], ns="team"
    )

    def alloc(init_mem, app_mem):
        g0, g1 = "GPU-n1-0", "GPU-n1-1"
        devices = {
            "NVIDIA": (
                (ContainerDevice(uuid=g0, type="NVIDIA", usedmem=init_mem, usedcores=10),),
                (
                    ContainerDevice(uuid=g0, type="NVIDIA", usedmem=app_mem, usedcores=10),
                    ContainerDevice(uuid=g1, type="NVIDIA", usedmem=3000, usedcores=10),
                ),
            )
        }
        return make_allocation(p, "n1", devices)

    reserved, written = alloc(3000, 1000), alloc(1000, 3000)
    assert reserved.usage == written.usage  # per device: 3000 on each GPU either way
    led.reserve(reserved)
    assert led.namespace_usage("team", "NVIDIA")[0] == 4000  # steady 1000 + 3000
    led.confirm(written)
    led.remove_pod(written.key)
    assert led.namespace_usage("team", "NVIDIA") == (0, 0)  # was (-2000, 0)
