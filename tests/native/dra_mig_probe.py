"""One DRA kubelet-plugin process against the fake NVML (test_dra_mig.py): discovers the GPUs
with ``operatingmode: mig`` as ``hami dra`` does, recovers MIG at start-up, then prepares or
unprepares the claims given.

    python dra_mig_probe.py <state dir> <command-json>

command: {"prepare": [claim, ...], "unprepare": [uid, ...]}. Prints one JSON document: what
start-up did, the kubelet's devices (or the error) per prepared claim, each claim's container
environment, and the MIG instances NVML has afterwards.
"""

import asyncio
import json
import os
import sys
from pathlib import Path

from hami.dra.model import SliceSettings, mig_devices
from hami.draplugin.checkpoint import Checkpoint
from hami.draplugin.command import _mig_manager, mig_layout
from hami.draplugin.plugin import Driver
from hami.draplugin.prepare import Paths
from hami.node.nvml import MigNvml, discover, open_nvml
from hami.node.settings import NodeSettings


def main() -> None:
    state, cmd = Path(sys.argv[1]), json.loads(sys.argv[2])
    open_nvml(os.environ["FAKE_NVML"])
    settings = NodeSettings(operating_mode="mig")
    gpus = [g for g in discover(settings, str(state / "sys")) if g.mig_profiles]
    layout = mig_layout(settings, gpus)
    claims = {c["metadata"]["name"]: c for c in cmd.get("prepare") or []}

    async def read(ns, name):
        return claims[name]

    args = type("Args", (), {"state_dir": str(state)})()
    driver = Driver(
        "n1",
        gpus,
        SliceSettings(),
        Checkpoint(state / "checkpoint.json"),
        read,
        Paths(hook_path=str(state / "hook"), cdi_dir=str(state / "cdi")),
        migs=mig_devices(gpus, layout),
        mig=_mig_manager(args, layout),
    )
    out: dict = {"recover": driver.recover_mig(), "prepared": {}, "env": {}}
    for c in cmd.get("prepare") or []:
        m = c["metadata"]
        try:
            devices = asyncio.run(driver.prepare(m["namespace"], m["name"], m["uid"]))
            out["prepared"][m["uid"]] = [d["device_name"] for d in devices]
            spec = json.loads((state / "cdi" / f"gpu.hami.io-{m['uid']}.json").read_text())
            out["env"][m["uid"]] = spec["devices"][0]["containerEdits"]["env"]
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out["prepared"][m["uid"]] = f"{type(exc).__name__}: {exc}"
    for uid in cmd.get("unprepare") or []:
        asyncio.run(driver.unprepare("ns", f"c-{uid}", uid))
    nvml = MigNvml()
    out["instances"] = {g.uuid: [[i.profile, i.start, i.mig_uuid] for i in nvml.instances(g.uuid)] for g in gpus}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
