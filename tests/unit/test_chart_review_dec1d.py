"""Chart findings of the 1 Dec review (fourth batch), checked on the rendered manifests with the helm
`make kube` installs: the NVIDIA MIG variables only in a container the NVIDIA toolkit lets have
them, the node selectors as the install guide writes them, the capabilities the node agents need
to remove what tenants wrote (run for real under those capabilities), and the guide's names."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .test_chart_review_webhook_scope import CHART, _helm

ROOT = Path(__file__).resolve().parents[2]
KUBE = "1.37.0"
MIG_VARS = ("NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES")


def _args(*sets: str, files: tuple[Path, ...] = (), set_files: tuple[str, ...] = ()) -> list[str]:
    args: list[str] = []
    for f in files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    for s in set_files:
        args += ["--set-file", s]
    return args


def render(*sets: str, release: str = "hami", files: tuple[Path, ...] = (), set_files: tuple[str, ...] = (), raw=()):
    cmd = [
        _helm(),
        "template",
        release,
        str(CHART),
        "--kube-version",
        KUBE,
        *_args(*sets, files=files, set_files=set_files),
        *raw,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}


def container(docs: dict, daemonset: str, name: str) -> dict:
    spec = docs[("DaemonSet", daemonset)]["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == name]
    return c


def plugin(docs: dict) -> dict:
    return container(docs, "hami-device-plugin", "device-plugin")


def env(c: dict) -> dict:
    return {e["name"]: e.get("value") for e in c.get("env") or ()}


def holds_sys_admin(c: dict) -> bool:
    """As the NVIDIA toolkit sees it: privileged, or CAP_SYS_ADMIN (or ALL) added."""
    sc = c.get("securityContext") or {}
    added = (sc.get("capabilities") or {}).get("add") or ()
    return bool(sc.get("privileged")) or any(a.upper().removeprefix("CAP_") in ("SYS_ADMIN", "ALL") for a in added)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------------------------------------
# 1. NVIDIA_MIG_* only where CAP_SYS_ADMIN is held


def test_the_default_device_plugin_sets_no_mig_variable():
    """Found by review, 1 Dec: the device plugin always had NVIDIA_MIG_MONITOR_DEVICES=all while it
    dropped every capability; the NVIDIA toolkit's legacy hook refuses such a container ("cannot
    set MIG_MONITOR_DEVICES in non privileged container"), so on ordinary nodes the plugin never
    started. Without MIG in the values there is now no NVIDIA_MIG_* variable and no SYS_ADMIN."""
    for sets in ((), ("devicePlugin.migStrategy=none",), ("devicePlugin.deviceListStrategy=cdi-cri",)):
        c = plugin(render(*sets))
        assert not set(MIG_VARS) & env(c).keys(), (sets, env(c))
        assert not holds_sys_admin(c), sets


def test_mig_in_the_values_gives_the_plugin_sys_admin_and_the_variables(tmp_path):
    """Found by review, 1 Dec (same finding): static MIG needs the MIG monitor capability, dynamic
    MIG the config capability too, and the toolkit grants either only with CAP_SYS_ADMIN. Each way
    the values ask for MIG renders SYS_ADMIN with the variables that MIG mode needs."""
    static = plugin(render("devicePlugin.migStrategy=mixed"))
    assert holds_sys_admin(static) and env(static).get("NVIDIA_MIG_MONITOR_DEVICES") == "all"
    assert "NVIDIA_MIG_CONFIG_DEVICES" not in env(static)
    via_args = plugin(render("devicePlugin.extraArgs={--mig-strategy=mixed}"))
    assert holds_sys_admin(via_args) and "NVIDIA_MIG_MONITOR_DEVICES" in env(via_args)

    mixed = write(tmp_path, "mixed.json", '{"nodeconfig": [{"name": "n1", "migstrategy": "mixed"}]}')
    by_node = plugin(render(set_files=(f"devicePlugin.nodeConfiguration.config={mixed}",)))
    assert holds_sys_admin(by_node) and "NVIDIA_MIG_MONITOR_DEVICES" in env(by_node)
    # the plugin's --mig-strategy overrides config.json's: no MIG, no capability
    overridden = plugin(
        render("devicePlugin.migStrategy=none", set_files=(f"devicePlugin.nodeConfiguration.config={mixed}",))
    )
    assert not holds_sys_admin(overridden) and not set(MIG_VARS) & env(overridden).keys()

    # config.json keys are read in any case (as Go's decoder reads them)
    dynamic = write(tmp_path, "dyn.json", '{"nodeconfig": [{"name": "n0"}, {"Name": "n1", "OperatingMode": "mig"}]}')
    dyn = plugin(render(set_files=(f"devicePlugin.nodeConfiguration.config={dynamic}",)))
    assert holds_sys_admin(dyn)
    assert env(dyn).get("NVIDIA_MIG_MONITOR_DEVICES") == "all" and env(dyn).get("NVIDIA_MIG_CONFIG_DEVICES") == "all"


def test_a_sys_admin_given_in_the_values_brings_the_variables_and_stays_valid():
    """The variables follow a SYS_ADMIN the user gives (privileged, SYS_ADMIN or ALL in any case);
    CAP_SYS_ADMIN, which the API server refuses beside allowPrivilegeEscalation false, drops it;
    with externalConfigName (not readable here) the config capability comes too."""
    for sets in (
        ("devicePlugin.securityContext.capabilities.add={SYS_ADMIN}",),
        ("devicePlugin.securityContext.capabilities.add={sys_admin}",),
        ("devicePlugin.securityContext.capabilities.add={ALL}",),
        ("devicePlugin.securityContext.privileged=true",),
    ):
        c = plugin(render(*sets))
        assert env(c).get("NVIDIA_MIG_MONITOR_DEVICES") == "all", sets
        assert "NVIDIA_MIG_CONFIG_DEVICES" not in env(c), sets
    cap = plugin(render("devicePlugin.securityContext.capabilities.add={CAP_SYS_ADMIN}"))
    assert "NVIDIA_MIG_MONITOR_DEVICES" in env(cap) and "allowPrivilegeEscalation" not in cap["securityContext"]
    plain = plugin(render("devicePlugin.securityContext.capabilities.add={SYS_ADMIN}"))
    assert plain["securityContext"]["allowPrivilegeEscalation"] is False  # kept where the API server accepts it
    external = plugin(
        render(
            "devicePlugin.nodeConfiguration.externalConfigName=my-config",
            "devicePlugin.securityContext.capabilities.add={SYS_ADMIN}",
        )
    )
    assert env(external).get("NVIDIA_MIG_CONFIG_DEVICES") == "all"
    assert not set(MIG_VARS) & env(plugin(render("devicePlugin.nodeConfiguration.externalConfigName=x"))).keys()


def test_no_render_sets_a_mig_variable_in_a_container_without_sys_admin(tmp_path):
    """The invariant behind the finding, over the chart's variants: a container of any DaemonSet
    or Deployment that sets NVIDIA_MIG_* holds CAP_SYS_ADMIN."""
    dyn = write(tmp_path, "dyn.json", '{"nodeconfig": [{"name": "n1", "operatingmode": "mig"}]}')
    variants = [
        render(),
        render("devicePlugin.migStrategy=mixed", "devicePlugin.passDeviceSpecsEnabled=true"),
        render("devicePlugin.securityContext.capabilities.add={NET_RAW}", "devicePlugin.migStrategy=mixed"),
        render("devicePlugin.injection=nri"),
        render("dra.enabled=true", "devicePlugin.enabled=false", "devicePlugin.migStrategy=mixed"),
        render(set_files=(f"devicePlugin.nodeConfiguration.config={dyn}",)),
    ]
    checked = 0
    for docs in variants:
        for (kind, name), d in docs.items():
            if kind not in ("DaemonSet", "Deployment"):
                continue
            spec = d["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                if set(MIG_VARS) & env(c).keys():
                    checked += 1
                    assert holds_sys_admin(c), (name, c["name"])
    assert checked == 4  # the three variants with MIG: the plugin's, and the DRA agent's in one


def test_the_dra_agent_with_mig_work_holds_sys_admin_and_the_variables(tmp_path):
    """Found on reading the fix above, 1 Dec: the DRA agent lists static MIG instances and makes
    dynamic ones like the device plugin, from the same strategy and config.json, but its container
    held no SYS_ADMIN and set no MIG variable, so on a real node the toolkit gave it no MIG
    capability. It now gets them when the values give MIG work, and not otherwise."""
    plain = container(render("dra.enabled=true", "devicePlugin.enabled=false"), "hami-dra", "dra")
    assert not holds_sys_admin(plain) and not set(MIG_VARS) & env(plain).keys()
    static = container(
        render("dra.enabled=true", "devicePlugin.enabled=false", "devicePlugin.migStrategy=mixed"), "hami-dra", "dra"
    )
    assert holds_sys_admin(static) and env(static).get("NVIDIA_MIG_MONITOR_DEVICES") == "all"
    assert "NVIDIA_MIG_CONFIG_DEVICES" not in env(static)
    assert static["securityContext"]["allowPrivilegeEscalation"] is False
    dyn = write(tmp_path, "dyn.json", '{"nodeconfig": [{"name": "n1", "operatingmode": "mig"}]}')
    dynamic = container(
        render(
            "dra.enabled=true",
            "devicePlugin.enabled=false",
            set_files=(f"devicePlugin.nodeConfiguration.config={dyn}",),
        ),
        "hami-dra",
        "dra",
    )
    assert holds_sys_admin(dynamic) and env(dynamic).get("NVIDIA_MIG_CONFIG_DEVICES") == "all"


def _notes(tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it: helm template does not render it, so a copy of the
    chart carries it as a named template, included by a probe ConfigMap."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_probe.tpl").write_text('{{- define "probe.notes" -}}\n' + text + "\n{{- end -}}\n")
    (chart / "templates" / "notes-probe.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-probe\ndata:\n  notes: {{ include "probe.notes" . | quote }}\n'
    )
    cmd = [_helm(), "template", "hami", str(chart), "--kube-version", KUBE, "--show-only", "templates/notes-probe.yaml"]
    out = subprocess.run(cmd + _args(*sets), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)["data"]["notes"]


def test_the_install_notes_say_why_sys_admin_was_added_and_what_to_set_for_an_external_config(tmp_path):
    """An externalConfigName the chart cannot read may give a node MIG: the notes give the exact
    --set; values that ask for MIG are named in the notes as the reason for SYS_ADMIN."""
    assert "SYS_ADMIN" not in _notes(tmp_path / "a")
    why = _notes(tmp_path / "b", "devicePlugin.migStrategy=mixed")
    assert "devicePlugin.migStrategy=mixed" in why and "SYS_ADMIN" in why
    external = _notes(tmp_path / "c", "devicePlugin.nodeConfiguration.externalConfigName=my-config")
    assert "externalConfigName=my-config" in external
    assert "--set 'devicePlugin.securityContext.capabilities.add={SYS_ADMIN}'" in external
    assert "SYS_ADMIN" not in _notes(
        tmp_path / "d",
        "devicePlugin.nodeConfiguration.externalConfigName=my-config",
        "devicePlugin.securityContext.capabilities.add={SYS_ADMIN}",
    )


def test_the_exact_set_the_notes_and_docs_give_turns_the_variables_on():
    """The --set the notes and docs/mig.md name is one helm takes, and it does what they say."""
    mig = (ROOT / "docs" / "mig.md").read_text()
    (given,) = set(re.findall(r"--set '([^']*SYS_ADMIN[^']*)'", mig))
    assert "NVIDIA_MIG_MONITOR_DEVICES" in env(plugin(render(given)))


# ---------------------------------------------------------------------------------------------
# 2. node selectors as docs/install.md writes them


def _fenced(doc: str, lang: str, needle: str) -> str:
    blocks = re.findall(r"^[ \t]*```" + lang + r"\n(.*?)^[ \t]*```", doc, re.S | re.M)
    (block,) = [b for b in blocks if needle in b]
    return "\n".join(line[3:] if line.startswith("   ") else line for line in block.splitlines())


def _selectors(docs: dict) -> list:
    return [
        docs[("DaemonSet", n)]["spec"]["template"]["spec"].get("nodeSelector")
        for n in ("hami-device-plugin", "hami-vgpu-monitor")
    ]


def test_the_install_guides_node_selector_forms_select_what_it_says(tmp_path):
    """Found by review, 1 Dec: the guide said to set devicePlugin.nvidiaNodeSelector to {} for
    every node, or to the GPU Operator's label; helm merges maps, so {} kept gpu: "on" and the
    Operator's label was required beside it, and the DaemonSets landed on no node, silently. Each
    form the guide now shows is rendered as written."""
    guide = (ROOT / "docs" / "install.md").read_text()
    # the command line (its --set / --set-string flags, as a shell splits them)
    words = shlex.split(_fenced(guide, "sh", "nvidiaNodeSelector").replace("\\\n", " "))
    assert words[:3] == ["helm", "install", "hami"]
    flags = [w for w in words[3:] if w not in ("charts/hami", "-n", "kube-system")]
    operator = {"nvidia.com/gpu.present": "true"}
    assert _selectors(render(raw=flags)) == [operator, operator]
    # the values file
    values = write(tmp_path, "values.yaml", _fenced(guide, "yaml", "nvidiaNodeSelector"))
    assert _selectors(render(files=(values,))) == [operator, operator]
    # every node
    (every,) = set(re.findall(r"`--set (devicePlugin\.nvidiaNodeSelector\.gpu=null)`", guide))
    assert _selectors(render(every)) == [None, None]
    # and what the guide warns of: {} in a values file keeps the chart's label
    empty = write(tmp_path, "empty.yaml", "devicePlugin:\n  nvidiaNodeSelector: {}\n")
    assert _selectors(render(files=(empty,))) == [{"gpu": "on"}, {"gpu": "on"}]


def _label_selector(docs: dict) -> str:
    (c,) = [
        c
        for c in docs[("Deployment", "hami-scheduler")]["spec"]["template"]["spec"]["containers"]
        if c["name"] != "kube-scheduler"
    ]
    (arg,) = [a for a in c["command"] + c.get("args", []) if a.startswith("--node-label-selector=")]
    return arg.split("=", 1)[1]


def test_the_managed_node_selector_forms_select_what_the_docs_say(tmp_path):
    """Found by review, 1 Dec: global.managedNodeSelector {pool: gpu} rendered
    --node-label-selector=pool=gpu,usage=gpu (merged with the default). The guide's --set form
    selects pool=gpu alone; configuration.md states the merge."""
    guide = (ROOT / "docs" / "install.md").read_text()
    (form,) = set(re.findall(r"`(--set global\.managedNodeSelector\.usage=null --set [^`]*)`", guide))
    flags = shlex.split(form)
    docs = render("global.managedNodeSelectorEnable=true", raw=flags)
    assert _label_selector(docs) == "pool=gpu"
    merged = write(
        tmp_path, "mns.yaml", "global:\n  managedNodeSelectorEnable: true\n  managedNodeSelector:\n    pool: gpu\n"
    )
    assert _label_selector(render(files=(merged,))) == "pool=gpu,usage=gpu"
    assert "`pool=gpu,usage=gpu`" in (ROOT / "docs" / "configuration.md").read_text()
    dropped = write(
        tmp_path,
        "mns2.yaml",
        "global:\n  managedNodeSelectorEnable: true\n  managedNodeSelector:\n    usage: null\n    pool: gpu\n",
    )
    assert _label_selector(render(files=(dropped,))) == "pool=gpu"


# ---------------------------------------------------------------------------------------------
# 3. the capabilities of the agents that remove what tenants wrote


def _caps(c: dict) -> set[str]:
    return set((c["securityContext"].get("capabilities") or {}).get("add") or ())


def test_the_agents_that_remove_tenant_trees_hold_dac_override_and_fowner_and_no_more():
    """Found by review, 1 Dec: a tenant's 0700 (or sticky) subdirectory in its region directory
    could not be removed by the root-without-capabilities monitor, device plugin or DRA agent,
    and its data stayed on the node. Exactly DAC_OVERRIDE and FOWNER are added to the three that
    remove such trees; the DRA monitor removes nothing and holds none."""
    docs = render()
    for c in (plugin(docs), container(docs, "hami-vgpu-monitor", "vgpu-monitor")):
        assert _caps(c) == {"DAC_OVERRIDE", "FOWNER"}, c["name"]
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
    dra = render("dra.enabled=true", "devicePlugin.enabled=false")
    assert _caps(container(dra, "hami-dra", "dra")) == {"DAC_OVERRIDE", "FOWNER"}
    assert _caps(container(dra, "hami-dra-monitor", "vgpu-monitor")) == set()
    # a securityContext of the user's keeps its own capabilities and gets the two
    own = plugin(render("devicePlugin.securityContext.capabilities.add={NET_RAW}"))
    assert _caps(own) == {"NET_RAW", "DAC_OVERRIDE", "FOWNER"}


def _tenant_tree(root: Path, mode: int) -> Path:
    """A region directory as a tenant (uid 1000) leaves it: a subdirectory of its own with
    ``mode``, holding a file and a directory of its own."""
    region = root / f"region-{mode:o}"
    region.mkdir(mode=0o777)
    sub = region / "d"
    sub.mkdir()
    (sub / "f").write_bytes(b"x" * 4096)
    (sub / "inner").mkdir()
    for p in (sub / "inner", sub / "f", sub):
        os.chown(p, 1000, 1000)
    os.chmod(sub, mode)
    return region


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_the_rendered_capabilities_let_root_remove_a_tenants_tree(tmp_path):
    """Found by review, 1 Dec (same finding), run for real: hami.node.files.remove_tree as root
    with exactly the capabilities the chart renders for each agent removes a tenant's 0700
    subdirectory and a sticky one (1777, 1700); with none (the old chart) it fails EACCES/EPERM."""
    docs = render()
    dra = render("dra.enabled=true", "devicePlugin.enabled=false")
    agents = {
        "device-plugin": plugin(docs),
        "monitor": container(docs, "hami-vgpu-monitor", "vgpu-monitor"),
        "dra": container(dra, "hami-dra", "dra"),
    }
    code = "import sys; from hami.node.files import remove_tree; remove_tree(sys.argv[1])"

    def remove_with(caps: set[str], tree: Path) -> subprocess.CompletedProcess:
        bounding = ",".join(["-all"] + [f"+{c.lower()}" for c in sorted(caps)])
        cmd = ["setpriv", f"--bounding-set={bounding}", sys.executable, "-c", code, str(tree)]
        return subprocess.run(cmd, capture_output=True, text=True)

    for where in ("none", *agents):
        (tmp_path / where).mkdir()
    for mode in (0o700, 0o1777, 0o1700):
        failed = remove_with(set(), _tenant_tree(tmp_path / "none", mode))
        assert failed.returncode != 0 and ("Permission denied" in failed.stderr or "not permitted" in failed.stderr)
        for name, c in agents.items():
            tree = _tenant_tree(tmp_path / name, mode)
            done = remove_with(_caps(c), tree)
            assert done.returncode == 0, (name, oct(mode), done.stderr)
            assert not tree.exists(), (name, oct(mode))


# ---------------------------------------------------------------------------------------------
# 4. npm for the image build


def test_the_image_builds_prerequisites_name_npm_and_its_registry():
    """Found by review, 1 Dec: `make image` and `make image-offline` run `make ui-assets`, which
    needs npm and the npm registry; the guide named only Debian's mirror and PyPI."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^image: .*\bui-assets\b", makefile, re.M) and re.search(
        r"^image-offline: .*\bui-assets\b", makefile, re.M
    )
    assert "command -v npm" in (ROOT / "scripts" / "install-ui-assets.sh").read_text()
    guide = (ROOT / "docs" / "install.md").read_text()
    section = guide.split("## Building the image", 1)[1].split("\n## ", 1)[0]
    assert "`npm`" in section and "npm registry" in section and "make ui-assets" in section


# ---------------------------------------------------------------------------------------------
# 5. the object names the guides give


def _names(release: str) -> set[str]:
    names: set[str] = set()
    for sets in (
        (),
        ("scheduler.kubeScheduler.separatePod=true", "scheduler.ui.enabled=true"),
        ("scheduler.extender.loopbackPort=0",),
        ("dra.enabled=true", "devicePlugin.enabled=false"),
    ):
        names |= {name for _, name in render(*sets, release=release)}
    return names


def test_the_guides_name_the_objects_of_their_own_helm_install_hami():
    """Found by review, 1 Dec: with release `hami` the chart does not double the prefix, so the
    guides' `daemonset/<release>-hami-device-plugin`, `<release>-hami-scheduler-tls`, ... named
    objects `helm install hami` never makes. Every `hami-...` name in install.md and
    configuration.md is one release `hami` renders; the rule's example for another release too."""
    rendered = _names("hami")
    for guide in ("docs/install.md", "docs/configuration.md"):
        text = (ROOT / guide).read_text()
        assert "<release>-hami-" not in text, guide
        spans = re.findall(r"`([^`]+)`", text)
        named = {m for s in spans for m in re.findall(r"(?<![\w./-])hami-[a-z0-9-]*[a-z0-9]", s)}
        named -= {"hami-core", "hami-real-node"}  # the operating mode; the test node's name
        assert named and named <= rendered, (guide, sorted(named - rendered))
    other = _names("gpu")
    rule = (ROOT / "docs" / "install.md").read_text().split("| Object |", 1)[0]
    examples = set(re.findall(r"`(gpu-hami-[a-z0-9-]+)`", rule))
    assert examples and examples <= other


def test_mig_work_is_seen_whatever_the_case_of_config_jsons_top_level_key(tmp_path):
    """Regression review, 1 Dec: the chart read only `nodeconfig`, while the programs read the key
    in any case (node/settings.py), so `nodeConfig` gave a dynamic-MIG node no MIG capability."""
    cfg = write(tmp_path, "dyn.json", '{"nodeConfig": [{"name": "n1", "operatingmode": "mig"}]}')
    c = plugin(render(set_files=(f"devicePlugin.nodeConfiguration.config={cfg}",)))
    assert holds_sys_admin(c) and env(c).get("NVIDIA_MIG_CONFIG_DEVICES") == "all"


def test_the_dra_agents_mig_work_follows_its_own_arguments_not_the_plugins():
    """Regression review, 1 Dec: the DRA agent's SYS_ADMIN followed the device plugin's extraArgs
    (which the agent does not run with) and missed its own dra.extraArgs --mig-strategy."""
    base = ("dra.enabled=true", "devicePlugin.enabled=false")
    plugins = container(render(*base, "devicePlugin.extraArgs={--mig-strategy=mixed}"), "hami-dra", "dra")
    assert not holds_sys_admin(plugins) and not set(MIG_VARS) & env(plugins).keys()
    own = container(render(*base, "dra.extraArgs={--mig-strategy=mixed}"), "hami-dra", "dra")
    assert holds_sys_admin(own) and env(own).get("NVIDIA_MIG_MONITOR_DEVICES") == "all"
