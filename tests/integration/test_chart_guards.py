"""The chart's device-pod guard and the scheduler's node guard (ValidatingAdmissionPolicies),
and the webhook's `hami.io/webhook: ignore` object selector.

- `templates/scheduler/device-pod-guard.yaml`: the webhook's device-pod rules (no privileged
  container, `CUDA_DISABLE_CONTROL` only in namespaces with the allow label) enforced by the API
  server for every device pod of the chart's scheduler, with no selector to opt out of: a pod that
  skips the webhook (the label `hami.io/webhook: ignore`, set by its author) and names the
  scheduler by hand is still refused;
- `templates/scheduler/node-guard.yaml`: the scheduler's ServiceAccount, which RBAC lets patch
  every node, may change node annotations only;
- `templates/scheduler/webhook.yaml`: the per-pod opt-out label is in the webhook's object
  selector only where the webhook is not limited to device pods (no matchConditions).

The policies are rendered with `helm template` and applied to the real test control plane,
requests made impersonating the users (as the allocation guard's test in test_chart.py).
"""

from __future__ import annotations

import uuid

import pytest
import yaml

from .test_chart import CHART, KUBE_VERSION

pytestmark = pytest.mark.integration

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
ALLOW = "hami.io/allow-disable-control"
MERGE = "application/merge-patch+json"
DEVICE_POD_GUARD = "templates/scheduler/device-pod-guard.yaml"
NODE_GUARD = "templates/scheduler/node-guard.yaml"
WEBHOOK = "templates/scheduler/webhook.yaml"


def _template(helm_bin, *args: str, release: str = "hami", namespace: str = "gpu", version: str = KUBE_VERSION):
    out = helm_bin("template", release, str(CHART), "--namespace", namespace, "--kube-version", version, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _webhook(helm_bin, *sets: str, version: str = KUBE_VERSION) -> dict:
    (doc,) = _template(helm_bin, "--show-only", WEBHOOK, *_sets(*sets), version=version)
    return doc["webhooks"][0]


def _apply(kube_cluster, docs: list[dict]) -> list[tuple[str, str]]:
    made = []
    for doc in docs:
        plural = {
            "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
            "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
        }[doc["kind"]]
        kube_cluster.api("POST", f"{ADMISSION}/{plural}", doc)
        made.append((plural, doc["metadata"]["name"]))
    return made


def _remove(kube_cluster, made: list[tuple[str, str]]) -> None:
    for plural, name in reversed(made):
        kube_cluster.api("DELETE", f"{ADMISSION}/{plural}/{name}", expect=(200, 404))


def _denied(call) -> str:
    from hami_devkit.cluster import ApiError

    with pytest.raises(ApiError) as err:
        call()
    assert err.value.status in (403, 422), err.value
    return str(err.value)


# ---------------------------------------------------------------------------------------------
# rendering


def test_the_opt_out_label_is_in_the_object_selector_only_without_device_pod_scoping(helm_bin):
    ignore = {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    scoped = _webhook(helm_bin)  # default: devicePodsOnly, matchConditions
    assert scoped["matchConditions"] and "objectSelector" not in scoped
    assert ignore in scoped["namespaceSelector"]["matchExpressions"]  # namespaces: the admin's label, kept
    everything = _webhook(helm_bin, "scheduler.admissionWebhook.devicePodsOnly=false")
    assert "matchConditions" not in everything and everything["objectSelector"]["matchExpressions"] == [ignore]
    # every pod reaches it: failing closed would refuse every pod of the cluster while the
    # scheduler is down (review, 1 Dec: it rendered the failurePolicy value, Fail)
    assert scoped["failurePolicy"] == "Fail" and everything["failurePolicy"] == "Ignore"
    # no matchConditions before 1.28: the chart's own pods must keep skipping the webhook
    old = _webhook(helm_bin, version="1.27.0")
    assert "matchConditions" not in old and everything["objectSelector"] == old["objectSelector"]
    # the user's own expressions are kept either way
    own = {"key": "team", "operator": "In", "values": ["a"]}
    mine = ("key=team", "operator=In", "values[0]=a")
    user = [f"scheduler.admissionWebhook.objectSelector.matchExpressions[0].{s}" for s in mine]
    assert _webhook(helm_bin, *user)["objectSelector"]["matchExpressions"] == [own]
    both = _webhook(helm_bin, *user, "scheduler.admissionWebhook.devicePodsOnly=false")
    assert both["objectSelector"]["matchExpressions"] == [ignore, own]


def test_the_guards_are_on_by_default_from_kubernetes_1_30(helm_bin):
    names = {(d["kind"], d["metadata"]["name"]) for d in _template(helm_bin)}
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert (kind, "hami-device-pod-guard") in names and (kind, "hami-scheduler-node-guard") in names
    off = _template(helm_bin, *_sets("scheduler.devicePodGuard.enabled=false", "scheduler.nodeGuard.enabled=false"))
    off_names = {d["metadata"]["name"] for d in off}
    assert not off_names & {"hami-device-pod-guard", "hami-scheduler-node-guard"}
    older = {d["metadata"]["name"] for d in _template(helm_bin, version="1.29.0")}
    assert not older & {"hami-device-pod-guard", "hami-scheduler-node-guard"}
    # no selector of any kind on the device-pod guard's binding: nothing to opt out with
    binding = next(d for d in _template(helm_bin, "--show-only", DEVICE_POD_GUARD) if d["kind"].endswith("Binding"))
    assert "matchResources" not in binding["spec"]


@pytest.mark.parametrize(
    "args", [["--disable-control-label=example.com/gpu-admin"], ["--disable-control-label", "example.com/gpu-admin"]]
)
def test_the_allow_label_follows_the_schedulers_flag(helm_bin, args):
    sets = [f"scheduler.extender.extraArgs[{i}]={a}" for i, a in enumerate(args)]
    policy = _template(helm_bin, "--show-only", DEVICE_POD_GUARD, *_sets(*sets))[0]
    allow = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "allowDisable")
    assert "'example.com/gpu-admin'" in allow and ALLOW not in allow
    default = _template(helm_bin, "--show-only", DEVICE_POD_GUARD)[0]
    assert f"'{ALLOW}'" in next(v["expression"] for v in default["spec"]["variables"] if v["name"] == "allowDisable")


def test_claims_of_the_dra_driver_reach_the_webhook_for_the_quota_check_with_dra_enabled(helm_bin):
    """With dra.enabled the webhook configuration has an entry for ResourceClaim CREATEs naming the
    driver's classes (the namespace quota check, docs/dra.md); without it, none."""

    def entries(*sets: str) -> dict:
        (doc,) = _template(helm_bin, "--show-only", WEBHOOK, *_sets(*sets))
        return {w["name"]: w for w in doc["webhooks"]}

    assert "claims.vgpu.hami.io" not in entries()
    claims = entries("dra.enabled=true")["claims.vgpu.hami.io"]
    assert claims["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["resourceclaims"],
            "scope": "Namespaced",
        }
    ]
    (condition,) = claims["matchConditions"]
    assert all(c in condition["expression"] for c in ("gpu.hami.io", "whole-gpu.hami.io", "mig.gpu.hami.io"))
    assert claims["failurePolicy"] == "Fail" and claims["sideEffects"] == "None"
    assert claims["clientConfig"]["service"]["path"] == "/webhook"


def _variable(policy: dict, name: str) -> str:
    return next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == name)


def test_the_guard_names_the_webhooks_grant_variables_and_follows_the_chart(helm_bin):
    """The guard spells the webhook's list (hami.core.names.GRANT_ENV) in CEL: the same names,
    the chart's priority resource, and the policy opt-in only where the node-wide policy is not
    already disable (the webhook writes it into every GPU container then)."""
    from hami.core import names

    policy = _template(helm_bin, "--show-only", DEVICE_POD_GUARD)[0]
    reserved = _variable(policy, "reserved")
    assert all(f'"{n}"' in reserved for n in names.GRANT_ENV) and f"'{names.GRANT_ENV_PREFIX}'" in reserved
    assert "'nvidia.com/priority'" in reserved and "GPU_CORE_UTILIZATION_POLICY" in _variable(policy, "disablers")
    custom_docs = _template(
        helm_bin,
        "--show-only",
        DEVICE_POD_GUARD,
        *_sets("resourcePriority=example.com/prio", "devices.nvidia.gpuCorePolicy=disable"),
    )
    custom = custom_docs[0]
    assert "'example.com/prio'" in _variable(custom, "reserved")
    # the placement rule (no spec.nodeName for a pod asking for our resources, any scheduler) is a
    # policy of its own: not for the kubelet's mirror pods, not in the namespaces the webhook skips,
    # and only where our device plugin runs (found by the regression review: it had none of these)
    docs = _template(
        helm_bin,
        "--show-only",
        DEVICE_POD_GUARD,
        "--set",
        "scheduler.admissionWebhook.whitelistNamespaces={gpu-operator}",
    )
    placement = next(
        d
        for d in docs
        if d["metadata"]["name"] == "hami-device-pod-placement-guard" and d["kind"] == "ValidatingAdmissionPolicy"
    )
    conditions = {c["name"]: c["expression"] for c in placement["spec"]["matchConditions"]}
    assert "system:node:" in conditions["not-a-kubelet"] and '"nvidia.com/gpu"' in conditions["asks-for-our-devices"]
    binding = next(
        d for d in docs if d["metadata"]["name"] == "hami-device-pod-placement-guard" and d["kind"].endswith("Binding")
    )
    expressions = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["gpu-operator"]} in expressions
    without_plugin = _template(helm_bin, "--show-only", DEVICE_POD_GUARD, "--set", "devicePlugin.enabled=false")
    assert (
        sorted(d["metadata"]["name"] for d in without_plugin)
        == ["hami-device-pod-guard"] * 2 + ["hami-namespace-label-guard"] * 2
    )
    assert "GPU_CORE_UTILIZATION_POLICY" not in _variable(custom, "disablers")
    custom_placement = next(d for d in custom_docs if d["metadata"]["name"] == "hami-device-pod-placement-guard")
    assert '"example.com/prio"' in custom_placement["spec"]["matchConditions"][2]["expression"]


# ---------------------------------------------------------------------------------------------
# enforced by the real API server


def _pod(
    name: str, scheduler: str, *, env=None, init_env=None, privileged=False, gpu=True, node=None, limits=None
) -> dict:
    container: dict = {"name": "main", "image": "busybox"}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", **(limits or {})}}
    if env:
        container["env"] = env
    if privileged:
        container["securityContext"] = {"privileged": True}
    spec: dict = {"schedulerName": scheduler, "containers": [container], "terminationGracePeriodSeconds": 0}
    if init_env:
        spec["initContainers"] = [{"name": "setup", "image": "busybox", "env": init_env}]
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        # the webhook's per-pod opt-out, set by the pod's author: the guard has none
        "metadata": {"name": name, "labels": {"hami.io/webhook": "ignore"}},
        "spec": spec,
    }


def test_device_pod_guard_enforces_the_webhooks_rules_on_pods_that_skip_it(kube_cluster, helm_bin, kube_namespace):
    suffix = uuid.uuid4().hex[:6]
    release, scheduler = f"d{suffix}", f"hami-guard-{suffix}"  # a scheduler name of its own: the cluster is shared
    docs = _template(helm_bin, "--show-only", DEVICE_POD_GUARD, "--set", f"schedulerName={scheduler}", release=release)
    plain, allowed = kube_namespace, f"allow-{suffix}"
    kube_cluster.create_namespace(allowed, labels={ALLOW: "true"})
    disable = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    tenant = "tenant-a"

    def create(ns: str, pod: dict) -> dict:
        return kube_cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", pod, as_user=tenant)

    made = _apply(kube_cluster, docs)
    try:
        probe = _pod("probe", scheduler, env=disable)

        def enforced() -> str | None:  # the API server picks a new policy up within seconds
            from hami_devkit.cluster import ApiError

            try:
                create(plain, probe)
            except ApiError as exc:
                return str(exc) if exc.status in (403, 422) else None
            kube_cluster.api("DELETE", f"/api/v1/namespaces/{plain}/pods/probe?gracePeriodSeconds=0")
            return None

        message = kube_cluster.wait_for(enforced, "the device-pod guard in force", timeout=60, interval=0.5)
        assert "'main'" in message and "CUDA_DISABLE_CONTROL" in message and f"{ALLOW}=true" in message

        # CUDA_DISABLE_CONTROL with any value, in an init container too (the webhook's rule)
        message = _denied(lambda: create(plain, _pod("init", scheduler, init_env=[{"name": "CUDA_DISABLE_CONTROL"}])))
        assert "'setup'" in message and "CUDA_DISABLE_CONTROL" in message
        # allowed where the namespace carries the label (which only namespace editors can set)
        create(allowed, _pod("opted-in", scheduler, env=disable))
        # a privileged container is refused even there
        message = _denied(lambda: create(allowed, _pod("root", scheduler, privileged=True)))
        assert "'main'" in message and "privileged" in message
        # and so is one adding SYS_ADMIN (the NVIDIA runtime counts it privileged), any spelling
        for i, cap in enumerate(("SYS_ADMIN", "cap_sys_admin", "ALL", "sys_adm\u0131n")):  # (a dotless i)
            admin = _pod(f"admin-{i}", scheduler)
            admin["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": [cap]}}
            message = _denied(lambda admin=admin: create(plain, admin))
            assert "'main'" in message and "adds the capability SYS_ADMIN" in message
        # pods for another scheduler, and pods of ours that ask for no device, are not affected
        create(plain, _pod("other", "default-scheduler", env=disable, privileged=True))
        create(plain, _pod("no-device", scheduler, env=disable, privileged=True, gpu=False))
        # GPU_CORE_UTILIZATION_POLICY=disable is the same opt-in (any letter case); force is not
        policy_off = [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "Disable"}]
        message = _denied(lambda: create(plain, _pod("policy-off", scheduler, env=policy_off)))
        assert "'main'" in message and "GPU_CORE_UTILIZATION_POLICY=disable" in message
        create(allowed, _pod("policy-off", scheduler, env=policy_off))
        create(plain, _pod("policy-force", scheduler, env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}]))
        # a policy the grant file cannot take (review, 1 Dec: 66,000 characters pushed the device
        # list out of what libvgpu reads) is refused; any other is HAMi's to read (unknown: default)
        create(plain, _pod("policy-other", scheduler, env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "enable"}]))
        for i, value in enumerate(("x" * 300, "default\n")):
            env = [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": value}]
            message = _denied(lambda env=env, i=i: create(plain, _pod(f"policy-bad-{i}", scheduler, env=env)))
            assert "'main' sets GPU_CORE_UTILIZATION_POLICY=" in message and "longer than 256" in message

        # the grant's own variables (a pod's env comes after the device plugin's, so these would
        # replace the grant's values), in any container, even where isolation may be switched off
        for ns, variable, value in (
            (plain, "NVIDIA_VISIBLE_DEVICES", "all"),
            (plain, "CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
            (plain, "CUDA_DEVICE_SM_LIMIT", "100"),
            (allowed, "CUDA_OVERSUBSCRIBE", "true"),
            (plain, "HAMI_NRI_INJECTION", "done"),
            (plain, "LIBVGPU_CONTEXT_SIZE", "0"),
            (plain, "CUDA_TASK_PRIORITY", "0"),
        ):
            env = [{"name": variable, "value": value}]
            message = _denied(lambda: create(ns, _pod("grant", scheduler, init_env=env)))
            assert "'setup'" in message and "the grant" in message, (variable, message)
        from_config = [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
        _denied(lambda: create(plain, _pod("grant", scheduler, env=from_config)))
        create(plain, _pod("fewer", scheduler, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]))

        # a volume over libvgpu's mounts (the pod's comes after the device plugin's and wins)
        def mounting(name: str, path: str) -> dict:
            pod = _pod(name, scheduler)
            pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": path, "subPath": "k"}]
            pod["spec"]["volumes"] = [{"name": "v", "configMap": {"name": "mine"}}]
            return pod

        for path in (
            "/etc/ld.so.preload",
            "/usr/local/vgpu/libvgpu.so",
            "/usr/local/vgpu",
            "/etc//ld.so.preload",
            "/data/hami-grant.env",
            "/x/hami-grant.env/.",
            "etc/ld.so.preload",  # relative: the runtime's from "/" (found by a review)
            "usr/local/vgpu/libvgpu.so",
        ):
            message = _denied(lambda: create(allowed, mounting("mount", path)))
            assert "'main'" in message and "libvgpu" in message, (path, message)
        # the kubelet mounts a file at the termination message path, after the device plugin's
        for path in ("/etc/ld.so.preload", "/usr/local/vgpu/libvgpu.so", "/hami-grant.env", "etc/ld.so.preload"):
            pod = _pod("message", scheduler)
            pod["spec"]["containers"][0]["terminationMessagePath"] = path
            message = _denied(lambda: create(plain, pod))
            assert "'main'" in message and "terminationMessagePath" in message, (path, message)
        create(plain, mounting("mount-ok", "/usr/local/vgpu-data/x"))
        # the priority the webhook writes from the priority resource
        create(
            plain,
            _pod(
                "prio",
                scheduler,
                env=[{"name": "CUDA_TASK_PRIORITY", "value": "1"}],
                limits={"nvidia.com/priority": "1"},
            ),
        )

        # a pod with a node assigned that asks for one of our resources, whatever its scheduler
        # (the kubelet would call our Allocate for a pod no scheduler of ours placed)
        # the placement guard is a policy of its own: the API server may take it up a moment
        # after the device-pod guard (a CI run found it not yet in force here)
        def placement_enforced() -> str | None:
            from hami_devkit.cluster import ApiError

            try:
                create(plain, _pod("pinned-probe", scheduler, node="gpu-node-1"))
            except ApiError as exc:
                return str(exc) if exc.status in (403, 422) else None
            kube_cluster.api("DELETE", f"/api/v1/namespaces/{plain}/pods/pinned-probe?gracePeriodSeconds=0")
            return None

        kube_cluster.wait_for(placement_enforced, "the placement guard in force", timeout=60, interval=0.5)
        for name, sched in (("pinned", scheduler), ("pinned-other", "no-such-scheduler")):
            message = _denied(lambda: create(plain, _pod(name, sched, node="gpu-node-1")))
            assert "spec.nodeName=gpu-node-1" in message, message
        create(plain, _pod("pinned-plain", "no-such-scheduler", node="gpu-node-1", gpu=False))

        # an ordinary device pod is fine
        create(plain, _pod("job", scheduler))

        # ephemeral containers added later (kubectl debug) are checked too; those already there are not
        def debug(ns: str, pod: str, name: str, **extra) -> dict:
            ephemeral = {"name": name, "image": "busybox", "targetContainerName": "main", **extra}
            return kube_cluster.api(
                "PATCH",
                f"/api/v1/namespaces/{ns}/pods/{pod}/ephemeralcontainers",
                {"spec": {"ephemeralContainers": [ephemeral]}},
                content_type="application/strategic-merge-patch+json",
                as_user=tenant,
            )

        message = _denied(lambda: debug(plain, "job", "rooted", securityContext={"privileged": True}))
        assert "'rooted'" in message and "privileged" in message
        message = _denied(lambda: debug(plain, "job", "unlimited", env=disable))
        assert "'unlimited'" in message and "CUDA_DISABLE_CONTROL" in message
        message = _denied(
            lambda: debug(plain, "job", "all-gpus", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
        )
        assert "'all-gpus'" in message and "the grant" in message
        debug(plain, "job", "shell")
        debug(allowed, "opted-in", "shell", env=disable)
        debug(allowed, "opted-in", "second")  # the earlier ephemeral container is not re-checked
        pod = kube_cluster.api("GET", f"/api/v1/namespaces/{plain}/pods/job")
        assert [c["name"] for c in pod["spec"]["ephemeralContainers"]] == ["shell"]
    finally:
        _remove(kube_cluster, made)
        kube_cluster.delete_namespace(allowed)


def test_the_scheduler_may_change_only_node_annotations(kube_cluster, helm_bin, kube_namespace):
    ns, release = kube_namespace, f"n{uuid.uuid4().hex[:6]}"
    scheduler = f"system:serviceaccount:{ns}:{release}-hami-scheduler"
    docs = _template(helm_bin, "--show-only", NODE_GUARD, release=release, namespace=ns)
    node = f"{release}-node"
    path = f"/api/v1/nodes/{node}"

    def patch(body: dict, user: str = scheduler, sub: str = "") -> dict:
        return kube_cluster.api("PATCH", path + sub, body, content_type=MERGE, as_user=user)

    kube_cluster.create_node(node, wait_ready=False)
    made = _apply(kube_cluster, docs)
    try:
        # the probe writes a label key of its own: one that lands before the policy is in force
        # must not be mistaken below for a write the guard let through
        def enforced() -> str | None:
            from hami_devkit.cluster import ApiError

            try:
                patch({"metadata": {"labels": {"hami.io/guard-probe": uuid.uuid4().hex[:8]}}})
            except ApiError as exc:
                return str(exc) if exc.status in (403, 422) else None
            return None

        message = kube_cluster.wait_for(enforced, "the scheduler's node guard in force", timeout=60, interval=0.5)
        assert f"may change only the annotations of node {node}, not its labels" in message

        # what the scheduler does: the handshake (merge patch) and the node lock (JSON patch with a test)
        patch({"metadata": {"annotations": {"hami.io/node-handshake": "Requesting_2025.01.01 00:00:00"}}})
        kube_cluster.api(
            "PATCH",
            path,
            [
                {
                    "op": "test",
                    "path": "/metadata/annotations/hami.io~1node-handshake",
                    "value": "Requesting_2025.01.01 00:00:00",
                },
                {
                    "op": "add",
                    "path": "/metadata/annotations/hami.io~1mutex.lock",
                    "value": "2025-01-01T00:00:00Z,ns,p",
                },
            ],
            content_type="application/json-patch+json",
            as_user=scheduler,
        )
        taint = {"key": "hami.io/evil", "effect": "NoSchedule"}
        assert "not its taints" in _denied(lambda: patch({"spec": {"taints": [taint]}}))
        assert "not its unschedulable" in _denied(lambda: patch({"spec": {"unschedulable": True}}))
        assert "not its labels" in _denied(
            lambda: patch({"metadata": {"labels": {"gpu": "off"}, "annotations": {"hami.io/x": "y"}}})
        )
        assert "not its spec" in _denied(lambda: patch({"spec": {"providerID": "kwok://elsewhere"}}))
        # another component's annotation (a CNI reads some: found by review), added or changed
        flannel = "flannel.alpha.coreos.com/public-ip"
        patch({"metadata": {"annotations": {flannel: "10.0.0.1"}}}, user="ops-admin")
        for value in ("203.0.113.9", None):
            message = _denied(lambda: patch({"metadata": {"annotations": {flannel: value}}}))
            assert f"may change only its own annotations (hami.io/...) of node {node}, not {flannel}" in message
        patch({"metadata": {"annotations": {"cambricon.com/dsmlu.lock": "2025-01-01T00:00:00Z,ns,p"}}})
        # the operator's GPU cordon is hami.io/ by name but not the scheduler's
        cordon = "hami.io/device-cordon"
        message = _denied(lambda: patch({"metadata": {"annotations": {cordon: "GPU-x"}}}))
        assert f"may change only its own annotations (hami.io/...) of node {node}, not {cordon}" in message
        assert "not its status" in _denied(
            lambda: patch({"status": {"capacity": {"nvidia.com/gpu": "99"}}}, sub="/status")
        )
        # everyone else is left to RBAC
        patch({"metadata": {"labels": {"team": "a"}}}, user="ops-admin")
        final = kube_cluster.api("GET", path)
        annotations, labels = final["metadata"]["annotations"], final["metadata"].get("labels") or {}
        assert annotations["hami.io/mutex.lock"] == "2025-01-01T00:00:00Z,ns,p" and "hami.io/x" not in annotations
        assert labels.get("team") == "a" and "gpu" not in labels
        assert not any(t.get("key") == "hami.io/evil" for t in final["spec"].get("taints") or [])
        assert not final["spec"].get("unschedulable")
        assert (final["status"].get("capacity") or {}).get("nvidia.com/gpu") != "99"
    finally:
        _remove(kube_cluster, made)
        kube_cluster.delete_node(node)


def test_only_administrators_label_a_namespace_out_of_the_guards(kube_cluster, helm_bin):
    """Anyone who may create namespaces could create one labelled to allow CUDA_DISABLE_CONTROL
    or to skip the webhook, and get GPUs without limits there. Found by an adversarial review."""
    suffix = uuid.uuid4().hex[:6]
    docs = [
        d
        for d in _template(helm_bin, "--show-only", DEVICE_POD_GUARD, release=f"n{suffix}")
        if d["metadata"]["name"].endswith("namespace-label-guard")
    ]
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    maker, rbac = f"ns-maker-{suffix}", "/apis/rbac.authorization.k8s.io/v1"
    role = {
        "metadata": {"name": maker},
        "rules": [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["create", "update", "patch", "get"]},
            {
                "apiGroups": [""],
                "resources": ["namespaces/status", "namespaces/finalize"],
                "verbs": ["update", "patch"],
            },
        ],
    }
    binding = {
        "metadata": {"name": maker},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": maker},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": maker}],
    }
    kube_cluster.api("POST", f"{rbac}/clusterroles", role)
    kube_cluster.api("POST", f"{rbac}/clusterrolebindings", binding)
    made = _apply(kube_cluster, docs)
    names: list[str] = []

    def create(name: str, labels: dict, **who) -> dict:
        names.append(name)
        return kube_cluster.api("POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}}, **who)

    tenant = dict(as_user=maker, as_groups=("system:authenticated",))
    try:

        def enforced() -> str | None:
            from hami_devkit.cluster import ApiError

            try:
                create(f"probe-{suffix}-{len(names)}", {ALLOW: "true"}, **tenant)
            except ApiError as exc:
                return str(exc) if exc.status in (403, 422) else None
            return None

        message = kube_cluster.wait_for(enforced, "the namespace label guard in force", timeout=60, interval=0.5)
        assert ALLOW in message and "namespacelabels.hami.io" in message
        assert "hami.io/webhook" in _denied(lambda: create(f"ignore-{suffix}", {"hami.io/webhook": "ignore"}, **tenant))
        create(f"plain-{suffix}", {"team": "a"}, **tenant)  # other labels: as before
        create(f"admin-{suffix}", {ALLOW: "true"})  # a cluster administrator may
        patch = {"metadata": {"labels": {ALLOW: "true"}}}
        path = f"/api/v1/namespaces/plain-{suffix}"
        assert ALLOW in _denied(lambda: kube_cluster.api("PATCH", path, patch, content_type=MERGE, **tenant))
        kube_cluster.api("PATCH", path, {"metadata": {"labels": {"team": "b"}}}, content_type=MERGE, **tenant)
        # the status and finalize subresources keep the labels a request sends (review, 1 Dec:
        # they were not matched, and an identity with only namespaces/status set them)
        status = f"{path}/status"
        assert ALLOW in _denied(lambda: kube_cluster.api("PATCH", status, patch, content_type=MERGE, **tenant))
        whole = kube_cluster.api("GET", path)
        whole["metadata"]["labels"]["hami.io/webhook"] = "ignore"
        assert "hami.io/webhook" in _denied(lambda: kube_cluster.api("PUT", f"{path}/finalize", whole, **tenant))
        kube_cluster.api("PATCH", status, {"metadata": {"labels": {"team": "c"}}}, content_type=MERGE, **tenant)
        # an administrator by RBAC (managed clusters' admins are not in system:masters)
        role["rules"].append({"apiGroups": ["hami.io"], "resources": ["namespacelabels"], "verbs": ["update"]})
        kube_cluster.api("PUT", f"{rbac}/clusterroles/{maker}", role)
        kube_cluster.wait_for(
            lambda: (
                kube_cluster.api("PATCH", path, patch, content_type=MERGE, expect=(200, 403, 422), **tenant)
                .get("metadata", {})
                .get("labels", {})
                .get(ALLOW)
            ),
            "the RBAC grant honoured",
            timeout=30,
            interval=0.5,
        )
    finally:
        _remove(kube_cluster, made)
        for name in names:
            kube_cluster.api("DELETE", f"/api/v1/namespaces/{name}", expect=(200, 202, 404))
        kube_cluster.api("DELETE", f"{rbac}/clusterrolebindings/{maker}", expect=(200, 404))
        kube_cluster.api("DELETE", f"{rbac}/clusterroles/{maker}", expect=(200, 404))
