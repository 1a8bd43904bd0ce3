"""``hami simulate``: read Nodes and Pods from YAML, schedule the pods, report.

With no ``--nodes``/``--pods`` it runs the bundled example (``hami/sim/examples``).
Exit status: 0 on success (pending pods are a result, not an error), 1 on bad input, with one
line on stderr naming the file, object and field.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import resources


from hami import safeyaml
from hami.config import default_device_config, load_device_config
from hami.core import CoreError, SchedulerConfig
from hami.core.names import VGPU_NODE
from hami.core.score import parse_gpu_policy, parse_node_policy
from hami.vendors import build_vendors
from hami.vendors.nvidia import NvidiaVendor

from .engine import DEFAULT_SCHEDULER, SimulationError, simulate
from .report import terminal_safe, to_html, to_json, to_table


#: bundled examples: name -> (nodes file, pods file, device-config file or None for the default config)
EXAMPLES: dict[str, tuple[str, str, str | None]] = {
    "default": ("nodes.yaml", "pods.yaml", None),
    "mixed": ("mixed-nodes.yaml", "mixed-pods.yaml", "mixed-device-config.yaml"),
    "mig": ("mig-nodes.yaml", "mig-pods.yaml", None),
    "dra": ("dra-nodes.yaml", "dra-pods.yaml", None),
}


EPILOG = (
    "Inputs: --nodes takes Node objects (a List or YAML documents); each needs the registration "
    f"annotation the device plugin writes ({NvidiaVendor.register_annotation} for NVIDIA), and a Node "
    "whose annotation is missing or malformed is skipped with a warning. --pods takes Pods (a dump "
    f"of a cluster, then events): a pod with {VGPU_NODE} and {NvidiaVendor.allocated_annotation} is "
    "taken as running there and a terminating one as still holding its GPUs, both from the start; "
    "a pod with only spec.nodeName is fitted on that node; a Succeeded or Failed pod holds nothing; "
    "then, in file order, a new pod is admitted (the webhook's rules), its nodes filtered as "
    "kube-scheduler filters them (nodeSelector, node affinity, taints, cordons, cpu/memory/pods of "
    "status.allocatable) and scheduled; a copy "
    "with metadata.deletionTimestamp of a pod given earlier deletes it; "
    "a ResourceQuota applies from that point on (--front-end dra also reads ResourceSlices, "
    "ResourceClaims and ResourceClaimTemplates). Other kinds are skipped with a warning. "
    "Exit status: 0 with a result (pending pods included), 1 on bad input or a bad option value "
    "(one line on stderr naming the file, object and field, or the option), 2 on an unknown option "
    "or one missing its value. More: docs/simulate.md."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument(
        "--nodes",
        metavar="NODES.yaml",
        help="Node objects with HAMi's registration annotation (kubectl get nodes -o yaml; - for standard "
        "input); goes with --pods",
    )
    parser.add_argument(
        "--pods",
        metavar="PODS.yaml",
        help="Pod objects (kubectl get pods -A -o yaml, and new ones; - for standard input); running pods "
        "first, then file order",
    )
    parser.add_argument(
        "--scheduler-name",
        default=DEFAULT_SCHEDULER,
        metavar="NAME",
        help=f"HAMi's scheduler name, as the webhook's --scheduler-name (default {DEFAULT_SCHEDULER}): "
        "a pod for another scheduler is left alone by the webhook and not placed",
    )
    parser.add_argument("--config", metavar="device-config.yaml", help="HAMi device configuration")
    parser.add_argument(
        "--example",
        choices=sorted(EXAMPLES),
        default=None,
        help="run a bundled example: default (NVIDIA cluster, the no-argument run), mixed "
        "(NVIDIA + Ascend + Cambricon + Hygon nodes, with its own device-config.yaml) or mig "
        "(an A100 node in MIG mode next to an L4 node) or dra (for --front-end dra: a node by its registration, "
        "one by its ResourceSlice, HAMi pods and pods with their own claims)",
    )
    parser.add_argument("--node-policy", default="binpack", help="binpack (default) or spread")
    parser.add_argument(
        "--gpu-policy", default="spread", help="binpack, spread (default), numa, mutex, topology-aware or a comma chain"
    )
    parser.add_argument(
        "--score-with-request",
        choices=("true", "false"),
        default="true",
        help="scores count the pod's own request (default); false = HAMi v2.10's scores",
    )
    parser.add_argument(
        "--front-end",
        choices=("extender", "dra"),
        default=None,
        help="extender (default; dra for --example dra): HAMi's scheduler extender places the "
        "pods; dra: each pod goes "
        "through the webhook's DRA translation (ResourceClaims) and kube-scheduler's DRA "
        "allocator places its claims on the ResourceSlices the node agent would publish "
        "(docs/dra.md, 'Simulating the DRA path')",
    )
    parser.add_argument(
        "--default-cores",
        type=int,
        default=None,
        metavar="N",
        help="--front-end dra only: cores a share takes when it asks for none (hami dra --default-cores; default 0)",
    )
    parser.add_argument(
        "--min-memory",
        type=int,
        default=None,
        metavar="MIB",
        help="--front-end dra only: the smallest memory share in MiB (hami dra --min-memory; default 1)",
    )
    parser.add_argument(
        "--output",
        "-o",
        choices=("table", "json", "html"),
        default="table",
        help="table (default), json, or html: the web UI's page for this run as one "
        "self-contained file (docs/ui.md), e.g. -o html > what-if.html",
    )


MAX_FILE = 64 << 20  # bytes per input file


def _read(path: str | None, bundled: str) -> tuple[str, str]:
    if path is None:
        ref = resources.files("hami.sim") / "examples" / bundled
        return ref.read_text(encoding="utf-8"), f"(bundled) {bundled}"
    try:
        if path == "-":  # kubectl get pods -A -o yaml | hami simulate --nodes nodes.yaml --pods -
            path = "(stdin)"
            if sys.stdin is None or getattr(sys.stdin, "closed", False):  # started with it closed (<&-)
                raise SimulationError(f"{path}: cannot read (standard input is closed)")
            data = sys.stdin.buffer.read(MAX_FILE + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE + 1)
    except OSError as exc:
        raise SimulationError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_FILE:
        raise SimulationError(f"{path}: larger than {MAX_FILE >> 20} MiB")
    if data[:2] == b"\x1f\x8b":
        raise SimulationError(f"{path}: gzip-compressed (decompress it first: gunzip -c {path} > plain.yaml)")
    try:
        return safeyaml.decode_utf8(data, path), path
    except safeyaml.YamlInputError as exc:
        raise SimulationError(str(exc)) from None


def _yaml_docs(text: str, source: str) -> list:
    try:
        return safeyaml.load_all_fast(text, source)
    except safeyaml.YamlInputError as exc:
        raise SimulationError(str(exc)) from None


def _one_line(exc: Exception) -> str:
    text = terminal_safe(" ".join(str(exc).split()))
    return text if len(text) <= 2000 else text[:1996] + " ..."


def _write(text: str) -> str | None:
    """Write the report and flush it; None, or why it could not be written (a full disk, a closed
    pipe, ``>&-``). Standard output is then pointed at the null device, so that Python's last
    flush at exit does not fail on the same bytes with a traceback."""
    out = sys.stdout
    if out is None or getattr(out, "closed", False):
        return "standard output is closed"
    try:
        out.write(text + "\n")
        out.flush()
    except OSError as exc:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, out.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass  # (not a file: nothing flushes it at exit)
        return exc.strerror or str(exc)
    return None


def run(args: argparse.Namespace) -> int:
    config_warnings: list[str] = []  # keys of --config nothing reads, printed with the run's warnings
    try:
        example = getattr(args, "example", None)
        if example and (args.nodes is not None or args.pods is not None):
            raise SimulationError("--example runs a bundled example; it does not go with --nodes/--pods")
        if (args.nodes is None) != (args.pods is None):
            raise SimulationError("--nodes and --pods go together (give both, or neither for the bundled example)")
        if [args.nodes, args.pods, args.config].count("-") > 1:
            raise SimulationError("only one of --nodes, --pods and --config can be - (standard input)")
        nodes_file, pods_file, config_file = EXAMPLES[example or "default"]
        nodes_text, nodes_src = _read(args.nodes, nodes_file)
        pods_text, pods_src = _read(args.pods, pods_file)
        if args.config or config_file:
            text, src = _read(args.config, config_file or "")
            device_config = load_device_config(text, src, warn=config_warnings.append)
        else:
            device_config = default_device_config()
        parse_node_policy(args.node_policy, "--node-policy")
        parse_gpu_policy(args.gpu_policy, "--gpu-policy")
        config = SchedulerConfig(
            build_vendors(device_config),
            args.node_policy,
            args.gpu_policy,
            request_in_scores=getattr(args, "score_with_request", "true") == "true",
        )
        front_end = getattr(args, "front_end", None) or ("dra" if example == "dra" else "extender")
        default_cores, min_memory = getattr(args, "default_cores", None), getattr(args, "min_memory", None)
        scheduler_name = getattr(args, "scheduler_name", None) or DEFAULT_SCHEDULER
        if front_end != "dra" and (default_cores is not None or min_memory is not None):
            flag = "--default-cores" if default_cores is not None else "--min-memory"
            raise SimulationError(f"{flag} applies to --front-end dra only (add --front-end dra, or leave {flag} out)")
        if front_end == "dra":
            from .dra import DraOptions, simulate_dra

            try:
                opts = DraOptions(
                    default_cores=0 if default_cores is None else default_cores,
                    min_memory_mib=1 if min_memory is None else min_memory,
                    scheduler_name=scheduler_name,
                )
            except ValueError as exc:
                raise SimulationError(str(exc)) from None
            result = simulate_dra(
                _yaml_docs(nodes_text, nodes_src),
                _yaml_docs(pods_text, pods_src),
                config,
                opts,
                sources=(nodes_src, pods_src),
            )
        else:
            result = simulate(
                _yaml_docs(nodes_text, nodes_src),
                _yaml_docs(pods_text, pods_src),
                config,
                sources=(nodes_src, pods_src),
                scheduler_name=scheduler_name,
            )
    except (SimulationError, CoreError) as exc:
        print(f"hami simulate: {_one_line(exc)}", file=sys.stderr)
        return 1
    except RecursionError:
        print("hami simulate: input nested too deeply", file=sys.stderr)
        return 1
    for w in config_warnings + result.warnings:
        print(f"hami simulate: warning: {terminal_safe(w)}", file=sys.stderr)
    if args.output == "html":
        import time

        front = " --front-end dra" if result.front_end == "dra" else ""
        text = to_html(result, config, title=f"hami simulate{front} {nodes_src} {pods_src}", now=time.time())
    else:
        text = to_json(result) if args.output == "json" else to_table(result)
    failed = _write(text)
    if failed is not None:
        print(f"hami simulate: cannot write output ({failed})", file=sys.stderr)
        return 1
    return 0
