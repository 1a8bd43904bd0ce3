"""Runs MigManager steps in a fresh process against the fake NVML (test_mig.py).

    python mig_probe.py <checkpoint> <command-json>

command: {"gpus": [...], "recover": [[pod, allocation], ...] | null, "prepare": {"pod": ..., "allocs": [...]} | null,
          "kill_at": "<step>" | null, "collect": [live uids] | null}
Prints one JSON document: what recover/prepare/collect returned, then the instances NVML has
and the checkpoint's entries. ``kill_at`` ends the process with status 9 right after that step.
"""

import json
import os
import sys

from hami.core.codec import MigAllocation
from hami.node.nvml import open_nvml
from hami.node.mig import Checkpoint, MigManager, PodRef
from hami.node.nvml import MigNvml


def alloc(d: dict) -> MigAllocation:
    return MigAllocation(**d)


def main() -> None:
    checkpoint, cmd = sys.argv[1], json.loads(sys.argv[2])
    open_nvml(os.environ["FAKE_NVML"])
    kill = cmd.get("kill_at")

    def hook(step: str) -> None:
        if step == kill:
            os._exit(9)

    nvml = MigNvml()
    mgr = MigManager(nvml, Checkpoint(checkpoint), cmd["gpus"], after_step=hook)
    out: dict = {}
    claims = [(PodRef(**p), alloc(a)) for p, a in cmd.get("recover") or []]
    out["recover"] = mgr.recover(claims)
    if cmd.get("prepare"):
        p = cmd["prepare"]
        try:
            got = mgr.prepare(PodRef(**p["pod"]), [alloc(a) for a in p["allocs"]])
            out["prepare"] = [{"mig": g.mig_uuid, "gi": g.gpu_instance_id, "ci": g.compute_instance_id} for g in got]
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out["error"] = f"{type(exc).__name__}: {exc}"
    if cmd.get("collect") is not None:
        out["collect"] = mgr.collect(set(cmd["collect"]))
    out["instances"] = {
        g: [[i.gi, i.profile, i.start, i.size, i.ci, i.mig_uuid] for i in nvml.instances(g)] for g in cmd["gpus"]
    }
    out["entries"] = {k: [e.state, e.gpu_instance_id, e.mig_uuid] for k, e in Checkpoint(checkpoint).load().items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
