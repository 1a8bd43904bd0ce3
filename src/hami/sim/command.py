"""``hami simulate``: read Nodes and Pods from YAML, schedule the pods, report.

With no ``--nodes``/``--pods`` it runs the bundled example (``hami/sim/examples``).
Exit status: 0 on success (pending pods are a result, not an error), 1 on bad input, with one
line on stderr naming the file, object and field.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from importlib import resources
from typing import Any

import yaml

from hami import safeyaml
from hami.config import default_device_config, load_device_config
from hami.core import CoreError, SchedulerConfig
from hami.core.names import VGPU_NODE
from hami.core.shape import MAX_DEPTH, ShapeError, check_tree
from hami.core.score import parse_gpu_policy, parse_node_policy
from hami.vendors import build_vendors
from hami.vendors.nvidia import NvidiaVendor

from .engine import DEFAULT_SCHEDULER, SimulationError, simulate
from .report import to_html, to_json, to_table


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
    "kube-scheduler filters them (nodeSelector, node affinity, taints, cordons) and scheduled; a copy "
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
        "--gpu-policy", default="spread", help="binpack, spread (default), numa, mutex or a comma chain"
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
    docs = _fast_docs(text)
    if docs is not None:
        return docs
    try:
        return safeyaml.load_all(text, source)
    except safeyaml.YamlInputError as exc:
        raise SimulationError(str(exc)) from None
    except (KeyError, IndexError, TypeError) as exc:  # PyYAML's own: !!bool abc, !!int ''
        raise SimulationError(f"{source}: not valid YAML (a tagged value its tag cannot read: {exc!r:.80})") from None


#: a float as YAML 1.1 (PyYAML) reads one in JSON's syntax: a dot, a signed exponent
_YAML_FLOAT = re.compile(r"-?[0-9]+\.[0-9]*(?:[eE][-+][0-9]+)?")

#: what PyYAML reads otherwise than libyaml or json: a tab (libyaml takes one where PyYAML
#: refuses it, e.g. indenting JSON), C1 controls and U+FFFE/U+FFFF (json takes them, PyYAML
#: refuses them; NEL inside a JSON string PyYAML folds to a space), a byte order mark past the
#: first character (libyaml skips one at a line's start, PyYAML reads it as text: cat a.yaml b.yaml)
_ODD_CHARS = re.compile("[\t\x7f-\x9f\ufeff\ufffe\uffff]")
#: a JSON surrogate escape: json joins a pair into one character, PyYAML keeps two
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")

#: PyYAML has libyaml (the fast path parses twice; in pure Python that is slower than safeyaml)
_LIBYAML = hasattr(yaml, "CSafeLoader")


class _Refused(Exception):
    """The fast readers met something only :mod:`hami.safeyaml` words well (it reads the text again)."""


def _json_int(text: str) -> int:
    if sum(ch.isdigit() for ch in text) > safeyaml.MAX_INT_DIGITS:
        raise _Refused
    return int(text)


def _json_float(text: str) -> float:
    if not _YAML_FLOAT.fullmatch(text):
        raise _Refused  # 1e3: YAML 1.1 reads it as a string, and so must this reader
    return float(text)


def _json_constant(text: str) -> Any:
    raise _Refused  # NaN, Infinity: not JSON, and nothing a Kubernetes object holds


class _CLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser with :mod:`hami.safeyaml`'s scalar rules (an integer past the digit limit
    is refused, a timestamp stays its text)."""

    def construct_yaml_int(self, node: Any) -> Any:
        if sum(ch.isdigit() for ch in str(node.value)) > safeyaml.MAX_INT_DIGITS:
            raise _Refused
        return super().construct_yaml_int(node)

    def construct_timestamp_text(self, node: Any) -> str:
        return str(node.value)


_CLoader.add_constructor("tag:yaml.org,2002:int", _CLoader.construct_yaml_int)
_CLoader.add_constructor("tag:yaml.org,2002:timestamp", _CLoader.construct_timestamp_text)

_NESTING = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_UNNESTING = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _fast_docs(text: str) -> list | None:
    """The documents of ``text`` read by C parsers (``kubectl get -o json`` by :mod:`json`, YAML
    by libyaml), or None when that is not possible or the text is not plainly good: the caller
    then reads it with :mod:`hami.safeyaml`, pure Python and about four times slower than
    libyaml (a 1000-node, 10,000-pod dump took 25 s to read), which words every refusal. The
    limits are safeyaml's: nesting is counted on libyaml's events before anything is composed
    (its composer recurses in C and would overflow the stack on deep nesting), integers and
    aliases as safeyaml checks them."""
    if _ODD_CHARS.search(text, 1 if text[:1] == "\ufeff" else 0) or _SURROGATE_ESCAPE.search(text):
        return None
    try:
        if text.lstrip()[:1] == "{":
            try:
                docs = [json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)]
            except ValueError:
                docs = None  # not JSON (YAML in flow style, or a mistake safeyaml words)
        else:
            docs = None
        if docs is None:
            if not _LIBYAML:
                return None  # PyYAML without libyaml: nothing faster to try
            depth = 0
            for event in yaml.parse(text, Loader=_CLoader):
                if getattr(event, "tag", None) is not None:
                    return None  # an explicit tag (no dump has one): libyaml and PyYAML differ on some (!)
                if isinstance(event, _NESTING):
                    depth += 1
                    if depth >= MAX_DEPTH:  # safeyaml counts the scalars inside too
                        return None
                elif isinstance(event, _UNNESTING):
                    depth -= 1
            docs = list(yaml.load_all(text, Loader=_CLoader))
        for i, doc in enumerate(docs):
            check_tree(doc, f"document {i + 1}", max_depth=MAX_DEPTH - 1)
    except (_Refused, yaml.YAMLError, ShapeError, ValueError, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - whatever else (KeyError from !!bool abc): safeyaml's to word
        return None
    return docs


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 2000 else text[:1996] + " ..."


def run(args: argparse.Namespace) -> int:
    config_warnings: list[str] = []  # keys of --config nothing reads, printed with the run's warnings
    try:
        if (args.nodes is None) != (args.pods is None):
            raise SimulationError("--nodes and --pods go together (give both, or neither for the bundled example)")
        example = getattr(args, "example", None)
        if example and args.nodes is not None:
            raise SimulationError("--example runs a bundled example; it does not go with --nodes/--pods")
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
        print(f"hami simulate: warning: {w}", file=sys.stderr)
    if args.output == "html":
        import time

        front = " --front-end dra" if result.front_end == "dra" else ""
        print(to_html(result, config, title=f"hami simulate{front} {nodes_src} {pods_src}", now=time.time()))
    else:
        print(to_json(result) if args.output == "json" else to_table(result))
    return 0
