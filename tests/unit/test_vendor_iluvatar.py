"""Iluvatar: one backend per chip, legacy registration, 256 MiB units, admission env/cores."""

from __future__ import annotations

import pytest

from ._vendorkit import NOW, admit, config, ctr, node, one, pod

CFG = config()
CNT, MEM, CORE = "iluvatar.ai/BI-V100-vgpu", "iluvatar.ai/BI-V100.vMem", "iluvatar.ai/BI-V100.vCore"
REG = "ilu-0,16,32768,100,BI-V100,0,true,0,hami-core:ilu-1,16,32768,100,BI-V100,0,true,1,hami-core:"


def ilu_node(name: str = "ilu-1", chip: str = "BI-V100", reg: str = REG) -> dict:
    return node(name, {f"hami.io/node-{chip}-register": reg})


def test_admission_env_and_whole_gpus_for_multi_gpu():
    p = admit(pod("p", [ctr(limits={CNT: 2}), ctr("log", limits={"cpu": 1})]), CFG)
    main, log = p["spec"]["containers"]
    assert main["resources"]["limits"][CORE] == 200
    assert main["env"] == [{"name": "SOL_CONTINER_NAME", "value": "main"}]
    assert "env" not in log


def test_whole_gpus_set_the_cores_request_too_where_the_container_names_one():
    """Extended resources need request == limit: the API server refused the pod when only the
    limit was raised to 100 x count."""
    p = admit(pod("p", [ctr(limits={CNT: 2, CORE: 30}, requests={CNT: 2, CORE: 30})]), CFG)
    res = p["spec"]["containers"][0]["resources"]
    assert res["limits"][CORE] == res["requests"][CORE] == 200
    p = admit(pod("p", [ctr(limits={CNT: 2}, requests={CNT: 2})]), CFG)
    assert CORE not in p["spec"]["containers"][0]["resources"]["requests"]  # defaulted from the limit


@pytest.mark.parametrize(
    "limits,allocated",
    [
        ({CNT: 1, MEM: 16, CORE: 50}, "ilu-0,BI-V100,4096,50:;"),  # 16 x 256 MiB
        ({CNT: 1, MEM: 4}, "ilu-0,BI-V100,1024,0:;"),  # default cores 0
        ({CNT: 2}, "ilu-0,BI-V100,32768,100:ilu-1,BI-V100,32768,100:;"),
    ],
)
def test_annotations_exact(limits, allocated):
    r = one([ilu_node()], pod("p", [ctr(limits=limits)]))
    assert r.annotations == {
        "hami.io/vgpu-node": "ilu-1",
        "hami.io/vgpu-time": str(int(NOW)),
        "hami.io/BI-V100-devices-allocated": allocated,
        "hami.io/BI-V100-devices-to-allocate": allocated,
    }


@pytest.mark.parametrize(
    "p,reason",
    [
        (pod("other-chip", [ctr(limits={"iluvatar.ai/MR-V100-vgpu": 1})]), "NodeInsufficientDevice"),
        (pod("big", [ctr(limits={CNT: 1, MEM: 200})]), "2/2 CardInsufficientMemory"),
        (pod("pinned", [ctr(limits={CNT: 1})], {"hami.io/use-BI-V100-uuid": "ilu-7"}), "2/2 CardUuidMismatch"),
        (pod("avoid", [ctr(limits={CNT: 1})], {"hami.io/no-use-BI-V100-uuid": "ilu-0"}), None),
    ],
)
def test_fit_table(p, reason):
    r = one([ilu_node()], p)
    if reason is None:
        assert r.annotations["hami.io/BI-V100-devices-allocated"].startswith("ilu-1,")
    else:
        assert r.reasons() == {"ilu-1": reason}
