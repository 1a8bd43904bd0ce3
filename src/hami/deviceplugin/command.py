"""``hami device-plugin``: run the NVIDIA node agent (or, with ``--dry-run``, just show it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from dataclasses import replace
from typing import Any, Sequence

from hami import malloc
from hami.config import read_device_config_file
from hami.core.errors import ConfigError
from hami.core.codec import encode_node_devices_json, encode_pair_scores
from hami.core.names import NODE_INJECTION, NODE_LOCK_HANDOFF
from hami.node import flags, nvml
from hami.node.cdi import DEFAULT_KIND, DEFAULT_PREFIX, CdiConfig, CdiConfigError, CdiGpu, spec as cdi_spec, write_spec
from hami.node.layout import HookPaths, UnsafeDirectoryError
from hami.node.nri import DEFAULT_SOCKET as NRI_SOCKET
from hami.node.nri.plugin import check_index
from hami.node.nvml import MigError, NvmlUnavailable, close_nvml, discover, ignored_xids, open_nvml
from hami.node.settings import NodeConfigError, NodeSettings, check_node_config, load_settings

from .allocate import DeviceSpecs, gpu_node, mig_cap_nodes
from .devices import DeviceState
from .static_mig import StaticMigError, check_strategy, discover_static, resources, settings_without_mig_gpus
from .preflight import PreflightError, check_other_plugins
from .register import HANDSHAKE, LEGACY_HANDSHAKE_MODES, REGISTER, SCORE
from .topology import pair_scores

log = logging.getLogger("hami.deviceplugin")

EXIT_CONFIG, EXIT_NVML, EXIT_PREFLIGHT = 2, 3, 4


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    flags.add_node_flags(p)
    p.add_argument(
        "--device-plugin-dir", default="/var/lib/kubelet/device-plugins", help="kubelet device-plugin directory"
    )
    p.add_argument("--register-interval", type=float, default=30.0, help="seconds between registration checks")
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between kubelet socket checks")
    p.add_argument(
        "--legacy-handshake",
        default="auto",
        choices=LEGACY_HANDSHAKE_MODES,
        help=f"answer the {HANDSHAKE} requests of a HAMi scheduler before v2.8, which drops a node whose "
        "request goes unanswered for 60 s: on (always, within 30 s), off (never), auto (once the node "
        "shows such a scheduler: its first expiry, or its pre-2025 time format; our scheduler's standing "
        "request is then left alone, no write) (default auto)",
    )
    p.add_argument(
        "--pod-watch",
        type=flags.bool_flag,
        default=True,
        metavar="BOOL",
        help="watch this node's pods so Allocate can skip reading the pod (default true; "
        "turn off when pods and nodes live in different etcd clusters, --etcd-servers-overrides, "
        "since the copy's freshness is judged by comparing their resourceVersions)",
    )
    p.add_argument(
        "--lock-release-delay",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="leave a finished pod's node lock for the scheduler's next Bind to swap over, and "
        "remove it only if it is still there after this many seconds (the node is annotated "
        f"{NODE_LOCK_HANDOFF}=swap; one lock write per pod instead of two); 0 = remove it "
        "at once, as HAMi's plugin does (use 0 with HAMi's own scheduler) (default 1)",
    )
    p.add_argument(
        "--device-list-strategy",
        default=env("DEVICE_LIST_STRATEGY", "envvar"),
        help="how containers are given their GPUs: envvar (NVIDIA_VISIBLE_DEVICES), cdi-annotations or "
        "cdi-cri (a CDI spec in --cdi-spec-dir, device names in Allocate); docs/device-plugin.md",
    )
    p.add_argument("--cdi-spec-dir", default="/var/run/cdi", help="where the CDI spec is written (cdi-* strategies)")
    p.add_argument(
        "--cdi-kind", default=DEFAULT_KIND, help=f"CDI kind <vendor>/<class> of our spec (default {DEFAULT_KIND})"
    )
    p.add_argument(
        "--cdi-annotation-prefix",
        default=DEFAULT_PREFIX,
        help=f"annotation prefix of CDI devices with cdi-annotations (default {DEFAULT_PREFIX})",
    )
    p.add_argument(
        "--topology-score",
        type=flags.bool_flag,
        default=env("ENABLE_TOPOLOGY_SCORE", "true"),
        metavar="BOOL",
        help=f"publish the GPUs' pairwise link scores ({SCORE}) for the topology-aware "
        "policy (env ENABLE_TOPOLOGY_SCORE; default true)",
    )
    p.add_argument(
        "--mig-strategy",
        default=env("MIG_STRATEGY"),
        choices=("none", "single", "mixed"),
        help="static MIG: 'mixed' advertises existing MIG instances as nvidia.com/mig-<profile> "
        "(env MIG_STRATEGY; overrides config.json migstrategy; default none)",
    )
    p.add_argument(
        "--mig-checkpoint",
        default=None,
        metavar="FILE",
        help="operatingmode mig: the node-local record of the MIG instances this plugin made "
        "(default <hook-path>/vgpu/mig/checkpoint.json, on the host)",
    )
    p.add_argument(
        "--mig-collect-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="operatingmode mig: seconds between clean-ups of instances whose pod is gone (default 5)",
    )
    p.add_argument(
        "--injection",
        default=env("HAMI_INJECTION", "allocate"),
        choices=("allocate", "nri"),
        help="how a container gets its grant: allocate (Allocate finds the pod through the node lock, "
        "HAMi's protocol) or nri (the container runtime's NRI hook gives it at container creation; "
        f"Allocate needs no pod and no lock, the node is annotated {NODE_INJECTION}=nri while "
        "the hook is registered; docs/nri.md) (env HAMI_INJECTION; default allocate)",
    )
    p.add_argument(
        "--nri-socket",
        default=env("NRI_SOCKET", NRI_SOCKET),
        help=f"the runtime's NRI socket, with --injection=nri (env NRI_SOCKET; default {NRI_SOCKET})",
    )
    p.add_argument(
        "--nri-plugin-index",
        default="50",
        help="the two-digit NRI plugin index (plugins are called in ascending order; default 50)",
    )
    p.add_argument(
        "--pass-device-specs",
        nargs="?",
        const=True,
        type=flags.bool_flag,
        default=env("PASS_DEVICE_SPECS", "false"),
        metavar="BOOL",
        help="also give each GPU container its device nodes in Allocate (DeviceSpecs, HAMi's "
        "passDeviceSpecsEnabled), with any --device-list-strategy: /dev/nvidia<minor> of its GPUs, a MIG "
        "device's nvidia-caps nodes, and nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset; each only "
        "if it exists under --dev-root (env PASS_DEVICE_SPECS; default false)",
    )
    p.add_argument(
        "--dev-root",
        default=env("NVIDIA_DEV_ROOT", "/"),
        metavar="DIR",
        help="with --pass-device-specs: the host root of the NVIDIA device nodes, <DIR>/dev/nvidia0 "
        "(env NVIDIA_DEV_ROOT; default /)",
    )
    p.add_argument(
        "--dev-root-ctr-path",
        default="",
        metavar="DIR",
        help="with --pass-device-specs: where this plugin sees --dev-root, when it is mounted elsewhere in "
        "its container (default: --dev-root itself)",
    )
    p.add_argument("--skip-preflight", action="store_true", help="do not look for other plugins serving the GPUs")
    p.add_argument(
        "--dry-run", action="store_true", help="print the discovered GPUs and the registration annotation, then exit"
    )
    p.add_argument("-v", "--verbose", action="count", default=0)


def injection_problem(args: argparse.Namespace, settings: NodeSettings) -> str | None:
    """Why ``--injection=nri`` cannot go with the rest of the configuration (None: it can). The
    NRI hook gives a container HAMi-core's env and mounts; MIG instances and CDI devices are made
    or named in Allocate, which has no pod in this mode."""
    if args.injection != "nri":
        return None
    try:
        check_index(args.nri_plugin_index)
    except ValueError as exc:
        return f"--nri-plugin-index: {exc}"
    if settings.operating_mode != "hami-core":
        return f"--injection=nri goes with operatingmode hami-core only (got {settings.operating_mode!r})"
    if args.device_list_strategy != "envvar":
        return f"--injection=nri goes with --device-list-strategy envvar only (got {args.device_list_strategy!r})"
    if settings.mig_strategy == "mixed":
        return "--injection=nri does not serve migstrategy mixed (static MIG instances)"
    if args.pass_device_specs:
        return "--injection=nri cannot go with --pass-device-specs (Allocate does not know the GPUs in this mode)"
    return None


def device_specs_problem(args: argparse.Namespace) -> str | None:
    """Why ``--pass-device-specs`` cannot go with the rest of the flags (None: it can). Any
    ``--device-list-strategy`` takes it, as in NVIDIA's plugin: with a CDI one the runtime applies
    the spec's device nodes over the DeviceSpecs' same paths (one node per path in the container)."""
    if not args.pass_device_specs:
        return None
    for name, value in (("--dev-root", args.dev_root), ("--dev-root-ctr-path", args.dev_root_ctr_path)):
        if value and not os.path.isabs(value):
            return f"{name}: expected an absolute directory, got {value!r}"
    view = os.path.join(args.dev_root_ctr_path or args.dev_root, "dev")
    if not os.path.isdir(view):
        return f"--pass-device-specs: the device directory {view!r} does not exist here"
    return None


def device_specs(
    args: argparse.Namespace, state: DeviceState, static: Sequence = (), proc_root: str = "/proc"
) -> DeviceSpecs | None:
    """What ``--pass-device-specs`` passes (None: off). Each GPU's node from NVML's minor number
    (as for the CDI spec); a static MIG device's from its GPU's minor and the driver's
    capability files of its GPU and compute instance (:func:`~.allocate.mig_cap_nodes`)."""
    if not args.pass_device_specs:
        return None
    nodes: dict[str, tuple[str, ...]] = {g.uuid: (gpu_node(nvml.minor_number(g.uuid)),) for g in state.gpus}
    parents = {u: p for r in static for u, p in r.parents.items() if p}
    mig = nvml.MigNvml() if parents else None
    for gpu in sorted(set(parents.values())):
        minor = nvml.minor_number(gpu)
        for inst in mig.instances(gpu) if mig else ():
            if inst.mig_uuid in parents and inst.ci is not None:
                caps = mig_cap_nodes(proc_root, minor, inst.gi, inst.ci)
                if not caps:
                    log.warning(
                        "MIG device %s: the driver names no nvidia-caps nodes for GPU instance %d "
                        "(%s/driver/nvidia/capabilities); only /dev/nvidia%d is passed",
                        inst.mig_uuid,
                        inst.gi,
                        proc_root,
                        minor,
                    )
                nodes[inst.mig_uuid] = (gpu_node(minor), *caps)
    specs = DeviceSpecs(nodes, args.dev_root, args.dev_root_ctr_path)
    # a GPU node missing under the dev root is skipped at every Allocate without a word: said once
    # here, since the usual cause is a root that holds none (GPU Operator's driver container makes
    # them under /run/nvidia/driver/dev, which HAMi's nvidiaDriverRoot "auto" finds; we do not)
    view = os.path.join(args.dev_root_ctr_path or args.dev_root, "dev")
    try:
        present = set(os.listdir(view))
    except OSError:  # device_specs_problem refuses a missing directory before this
        present = set()
    missing = sorted({own[0] for own in nodes.values()} - present)  # each GPU's node (a MIG device's: its GPU's)
    if missing:
        log.warning(
            "--pass-device-specs: --dev-root=%s has no %s under %s; those GPUs' containers get no device "
            "node from the plugin (only the NVIDIA container runtime's). GPU Operator's driver container: "
            "--dev-root=/run/nvidia/driver (chart: devicePlugin.devRoot)",
            args.dev_root,
            ", ".join(missing),
            view,
        )
    return specs


def cdi_gpus(state: DeviceState) -> list[CdiGpu]:
    """Each GPU's /dev/nvidia<minor>, from NVML (open)."""
    return [CdiGpu(g.uuid, nvml.minor_number(g.uuid)) for g in state.gpus]


def describe(
    settings: NodeSettings,
    state: DeviceState,
    cdi: CdiConfig | None = None,
    static: Sequence = (),
    specs: DeviceSpecs | None = None,
) -> dict:
    extra: dict = {"cdiSpec": cdi_spec(cdi_gpus(state), cdi)} if cdi is not None and cdi.enabled else {}
    if specs is not None:  # what each device's Allocate would pass, as the host has it now
        extra["deviceSpecs"] = {
            u: [{"containerPath": d.container_path, "hostPath": d.host_path} for d in specs.specs([u])]
            for u in specs.nodes
        }
    return {
        **extra,
        "resource": settings.resource_name,
        "socket": settings.socket_name,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memoryMiB": g.memory_mib,
                "busId": g.bus_id,
                "numa": g.numa,
            }
            for g in state.gpus
        ],
        "kubeletDevices": len(state.kubelet_devices()),
        "migResources": {r.settings.resource_name: list(r.mig_uuids) for r in static},
        "migGpus": {u: p for r in static for u, p in r.parents.items()},  # whose fault marks it unhealthy
        "annotations": {
            REGISTER: encode_node_devices_json(state.registration()),
            **({SCORE: encode_pair_scores(state.pair_scores)} if state.pair_scores is not None else {}),
        },
    }


async def _serve(
    args: argparse.Namespace,
    settings: NodeSettings,
    state: DeviceState,
    cdi: CdiConfig,
    static: list,
    asymmetric: tuple = (),
    specs: DeviceSpecs | None = None,
) -> int:
    from .agent import NodeAgent
    from .kube import Kube, api_client
    from hami.node.mig import Checkpoint, MigManager

    kube = Kube(await api_client(args.kubeconfig), args.node_name)
    # only when on, so an agent without device-spec support still starts with the flag off
    wiring: dict[str, Any] = {"device_specs": specs} if specs is not None else {}
    agent = NodeAgent(
        kube,
        settings,
        list(state.gpus),
        args.device_plugin_dir,
        HookPaths(args.hook_path, args.lock_dir, tuple(args.driver_mount)),
        register_interval=args.register_interval,
        legacy_handshake=args.legacy_handshake,
        poll=args.poll_interval,
        ignored_xids=ignored_xids(),
        pod_watch=args.pod_watch,
        lock_release_delay=args.lock_release_delay,
        cdi=cdi,
        scores=state.pair_scores,
        mig=MigManager(
            nvml.MigNvml(),
            Checkpoint(args.mig_checkpoint or f"{args.hook_path.rstrip('/')}/vgpu/mig/checkpoint.json"),
            state.uuids,
        )
        if settings.operating_mode == "mig"
        else None,
        mig_interval=args.mig_collect_interval,
        static_mig=static,
        asymmetric=asymmetric,
        injection=args.injection,
        nri_socket=args.nri_socket,
        nri_index=args.nri_plugin_index,
        **wiring,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.start()
    except (MigError, UnsafeDirectoryError) as exc:  # (a host directory planted to be followed: node/layout.py)
        print(f"hami device-plugin: refusing to start: {exc}", file=sys.stderr)
        await kube.close()
        return EXIT_CONFIG
    try:
        done, _ = await asyncio.wait(
            [asyncio.create_task(stop.wait()), *agent.tasks], return_when=asyncio.FIRST_COMPLETED
        )
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        if failed:
            log.error("device plugin stopped: %s", failed[0].exception())
            return 1
    finally:
        await agent.stop()
        await kube.close()
    return 0


def _static_mig(settings: NodeSettings) -> tuple[NodeSettings, list]:
    """migstrategy mixed: the MIG resources, and the settings without the GPUs they come from."""
    if settings.mig_strategy != "mixed":
        return settings, []
    mig_gpus = [
        u
        for i, u in enumerate(nvml.gpu_uuids())
        if u not in settings.filter_uuids and i not in settings.filter_indexes and nvml.mig_enabled(u)
    ]  # filterdevices leaves a GPU out whatever serves it
    parents: dict[str, str] = {}  # MIG device -> its GPU: a fault on the GPU marks its instances
    static = resources(discover_static(mig_gpus, settings.resource_name.split("/", 1)[0], parents), parents)
    log.info(
        "migstrategy mixed: %s",
        ", ".join(f"{r.settings.resource_name} x{len(r.mig_uuids)}" for r in static) or "no MIG instances",
    )
    return settings_without_mig_gpus(settings, mig_gpus), static


def _topology(gpus: list) -> tuple[dict[str, dict[str, int]], tuple]:
    found = pair_scores(nvml.read_links([g.uuid for g in gpus]))
    for a, b in found.asymmetric:
        log.warning(
            "GPUs %s and %s report different NVLink counts to each other (AsymmetricGPUP2PLink); the pair scores 0",
            a,
            b,
        )
    return found.scores, found.asymmetric


def flag_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with a flag's value on its own (None: nothing), in one line naming it."""
    if not args.node_name and not args.dry_run:
        return "--node-name (or env NODE_NAME) is required"
    # argparse checks the choices of a value given on the command line only: one from the env
    # went through unchecked (HAMI_INJECTION=NRI ran the lock protocol without a word)
    for flag, env_name, value, choices in (
        ("--injection", "HAMI_INJECTION", args.injection, ("allocate", "nri")),
        ("--mig-strategy", "MIG_STRATEGY", args.mig_strategy or "none", ("none", "single", "mixed")),
    ):
        if value not in choices:
            return f"{flag} (env {env_name}): expected one of {', '.join(choices)}, got {value!r}"
    # (a negative or zero interval made a loop that never waits, NaN one that never wakes)
    for flag, value, low, high in (
        ("--register-interval", args.register_interval, 0.1, 3600),
        ("--poll-interval", args.poll_interval, 0.1, 60),
        ("--mig-collect-interval", args.mig_collect_interval, 0.1, 3600),
        ("--lock-release-delay", args.lock_release_delay, 0, 60),
    ):
        if not low <= value <= high:
            return f"{flag}: expected {low} to {high} seconds, got {value!r}"
    return None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG
        if args.verbose > 1
        else logging.INFO
        if args.verbose or not args.dry_run
        else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    problem = flag_problem(args)
    if problem:
        print(f"hami device-plugin: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        if args.config_file:  # named but missing is refused, as the scheduler refuses it
            read_device_config_file(args.config_file, "--config-file", warn=lambda _: None)
        check_node_config(args.node_config)
        settings = load_settings(args.node_name, args.config_file, args.node_config)
    except (ConfigError, NodeConfigError) as exc:
        print(f"hami device-plugin: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.mig_strategy:
        settings = replace(settings, mig_strategy=args.mig_strategy)
    problem = injection_problem(args, settings) or device_specs_problem(args)
    if problem:
        print(f"hami device-plugin: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        check_strategy(settings.mig_strategy, settings.operating_mode)
    except StaticMigError as exc:
        print(f"hami device-plugin: refusing to start: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        cdi = CdiConfig(args.device_list_strategy, args.cdi_kind, args.cdi_annotation_prefix, args.cdi_spec_dir)
    except CdiConfigError as exc:
        print(f"hami device-plugin: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if cdi.enabled and settings.operating_mode != "hami-core":
        print(
            f"hami device-plugin: --device-list-strategy {cdi.strategy!r} goes with operatingmode hami-core only "
            f"(got {settings.operating_mode!r}: its devices are not in the CDI spec)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        open_nvml(args.nvml_library)
    except NvmlUnavailable as exc:
        print(f"hami device-plugin: refusing to start: {exc}", file=sys.stderr)
        return EXIT_NVML
    try:
        settings, static = _static_mig(settings)
        if cdi.enabled and static:
            print(
                f"hami device-plugin: --device-list-strategy {cdi.strategy!r} goes with whole GPUs only: "
                f"migstrategy mixed serves MIG instances, which are not in the CDI spec",
                file=sys.stderr,
            )
            return EXIT_CONFIG
        try:
            gpus = discover(settings, args.sysfs_root)
        except MigError as exc:
            print(f"hami device-plugin: refusing to start: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        scores, asymmetric = _topology(gpus) if args.topology_score else (None, ())
        state = DeviceState(gpus, settings, scores)
        specs = device_specs(args, state, static)
        if args.dry_run:
            print(json.dumps(describe(settings, state, cdi, static, specs), indent=2))
            return 0
        if cdi.enabled:
            path = write_spec(cdi_spec(cdi_gpus(state), cdi), cdi.spec_dir)
            log.info("CDI spec for %d GPUs written to %s (kind %s)", len(state.gpus), path, cdi.kind)
        if not args.skip_preflight:
            try:
                asyncio.run(
                    check_other_plugins(
                        args.device_plugin_dir, settings.socket_name, state.uuids, settings.resource_name
                    )
                )
            except PreflightError as exc:
                print(f"hami device-plugin: refusing to start: {exc}", file=sys.stderr)
                return EXIT_PREFLIGHT
        malloc.tune()  # weeks under churn: see hami.malloc
        return asyncio.run(_serve(args, settings, state, cdi, static, asymmetric, specs))
    finally:
        close_nvml()
