{{/* Names and labels shared by every template. */}}

{{- define "hami.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "hami.scheduler" -}}{{ include "hami.fullname" . }}-scheduler{{- end -}}
{{- define "hami.device-plugin" -}}{{ include "hami.fullname" . }}-device-plugin{{- end -}}
{{- /* (hami-py) `hami monitor` beside the device plugin: a DaemonSet and ServiceAccount of its own (templates/monitor/) */}}
{{- define "hami.monitor" -}}{{ include "hami.fullname" . }}-vgpu-monitor{{- end -}}
{{- define "hami.scheduler.tls" -}}{{ include "hami.scheduler" . }}-tls{{- end -}}

{{- define "hami.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The metadata annotations of an object: global.annotations (as in HAMi's chart: on every object the
chart makes) under the object's own (.extra), which win on the same key. Nothing when both are empty.
*/}}
{{- define "hami.annotations" -}}
{{- $all := merge (dict) (.extra | default dict) (.root.Values.global.annotations | default dict) -}}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
The sha256 of a chart ConfigMap's data alone, for a pod template's checksum/ annotation: what the
program reads. Labels and annotations (global.annotations, the chart version) change no file, so
they roll nothing. Call with (dict "root" $ "template" "/scheduler/configmap.yaml").
*/}}
{{- define "hami.dataChecksum" -}}
{{- $doc := include (print .root.Template.BasePath .template) .root | fromYaml | default dict -}}
{{- get $doc "data" | default dict | toJson | sha256sum -}}
{{- end -}}

{{- define "hami.scheduler.selector" -}}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: hami-scheduler
{{- end -}}

{{- define "hami.device-plugin.selector" -}}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: hami-device-plugin
{{- end -}}

{{- define "hami.monitor.selector" -}}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: hami-vgpu-monitor
{{- end -}}

{{/* "true" when the node monitor runs (its own DaemonSet, templates/monitor/): devicePlugin.enabled and
devicePlugin.monitor.enabled (it reads the regions the device plugin writes); "" otherwise */}}
{{- define "hami.monitor.enabled" -}}
{{- if and .Values.devicePlugin.enabled .Values.devicePlugin.monitor.enabled -}}true{{- end -}}
{{- end -}}

{{/*
The pod-level settings of the device plugin's DaemonSet and the monitor's (both from devicePlugin.*):
the same GPU nodes (nvidiaNodeSelector, tolerations), the same runtime class (NVML through the NVIDIA
runtime), node-critical priority, hostPID (HAMi's key, off by default: neither program needs it),
image pull secrets and the runtime's default seccomp filter. Indent with nindent 6 under spec:.
*/}}
{{- define "hami.gpuNodePod" -}}
{{- $dp := .Values.devicePlugin -}}
{{- include "hami.priorityClass" . }}
hostPID: {{ $dp.hostPID }}
{{- include "hami.imagePullSecrets" . }}
{{- with $dp.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $dp.nvidiaNodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $dp.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  seccompProfile:
    type: RuntimeDefault   # the runtime's default syscall filter, as the scheduler pod has
{{- end -}}

{{/* image: registry/repository:tag with global overrides. Call with (dict "image" .x "root" $) */}}
{{- define "hami.image" -}}
{{- $registry := default .image.registry .root.Values.global.imageRegistry -}}
{{- $tag := .image.tag | default .root.Values.global.imageTag | default .root.Chart.AppVersion -}}
{{- if $registry -}}{{ printf "%s/%s:%s" $registry .image.repository $tag }}{{- else -}}{{ printf "%s:%s" .image.repository $tag }}{{- end -}}
{{- end -}}

{{- define "hami.kubeSchedulerImage" -}}
{{- $img := .Values.scheduler.kubeScheduler.image -}}
{{- $tag := $img.tag -}}
{{- if not $tag -}}
{{- /* the cluster's own version, as vX.Y.Z: Argo CD and others pass "v1.34" without a patch */ -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{- $tag = printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch -}}
{{- end -}}
{{- $registry := default $img.registry .Values.global.imageRegistry -}}
{{- printf "%s/%s:%s" $registry $img.repository $tag -}}
{{- end -}}

{{- define "hami.imagePullSecrets" -}}
{{- /* global.imagePullSecrets and each image's pullSecrets (HAMi's per-image key), in every pod: a
secret a pod's images do not need costs nothing */ -}}
{{- $names := list -}}
{{- $v := .Values -}}
{{- range $list := list $v.global.imagePullSecrets $v.scheduler.extender.image.pullSecrets $v.scheduler.kubeScheduler.image.pullSecrets $v.devicePlugin.image.pullSecrets ($v.devicePlugin.monitor.image | default dict).pullSecrets ($v.dra.image | default dict).pullSecrets -}}
{{- range ($list | default list) -}}
{{- if kindIs "map" . -}}{{- $names = append $names (toString .name) -}}{{- else -}}{{- $names = append $names (toString .) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- with $names | compact | uniq }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The scheduler PodDisruptionBudget's budget: HAMi's scheduler.podDisruptionBudget, read as
HAMi's chart reads it: maxUnavailable when given, else minAvailable, else minAvailable 1. HAMi's
values.yaml has minAvailable: 1 with "# maxUnavailable: 1" below it, so a copied file with that line
uncommented (or --set ...maxUnavailable=1 over it) has both; a null is a key left unset */}}
{{- define "hami.scheduler.pdbBudget" -}}
{{- $pdb := .Values.scheduler.podDisruptionBudget | default dict -}}
{{- if not (kindIs "invalid" $pdb.maxUnavailable) -}}
maxUnavailable: {{ $pdb.maxUnavailable }}
{{- else if not (kindIs "invalid" $pdb.minAvailable) -}}
minAvailable: {{ $pdb.minAvailable }}
{{- else -}}
minAvailable: 1
{{- end -}}
{{- end -}}


{{/* The Service the API server calls the admission webhook through: every synced replica. */}}
{{- define "hami.scheduler.webhookService" -}}{{ include "hami.scheduler" . }}-webhook{{- end -}}

{{/*
The serving certificate's names, as JSON {"dns": [...], "ips": [...]}: both Services (the
scheduler's, and the webhook's), localhost, and customURL's host. Used by the helm-made
certificate and by cert-manager's.
*/}}
{{- define "hami.tls.names" -}}
{{- $ns := include "hami.namespace" . -}}
{{- $ips := list "127.0.0.1" -}}
{{- $dns := list "localhost" -}}
{{- range $svc := list (include "hami.scheduler" .) (include "hami.scheduler.webhookService" .) -}}
{{- $dns = concat $dns (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) -}}
{{- end -}}
{{- $custom := .Values.scheduler.admissionWebhook.customURL -}}
{{- if and $custom.enabled (ne $custom.host "127.0.0.1") -}}
{{- if regexMatch "^[0-9.]+$" $custom.host -}}{{- $ips = append $ips $custom.host -}}{{- else -}}{{- $dns = append $dns $custom.host -}}{{- end -}}
{{- end -}}
{{- dict "dns" $dns "ips" $ips | toJson -}}
{{- end -}}

{{/*
The webhook/extender certificate, made once per render and shared by every template that needs
it (Secret, webhook caBundle, kube-scheduler's tlsConfig). On upgrade the existing Secret is
reused (lookup), so the CA does not change under running pods, as long as it was made for the
names wanted now (its hami.io/tls-names annotation; a Secret of an older chart has none). A
certificate made again while an old one exists is trusted beside the old CA (caBundle holds
both): running pods serve the old certificate until the kubelet refreshes their mounted Secret
(up to a minute or two), and the API server must accept either in between. Not used with
cert-manager.
*/}}
{{- define "hami.tls.generate" -}}
{{- if not (hasKey .Values "__hamiTLS") -}}
{{- $names := include "hami.tls.names" . -}}
{{- $secret := lookup "v1" "Secret" (include "hami.namespace" .) (include "hami.scheduler.tls" .) -}}
{{- $old := "" -}}
{{- if and $secret $secret.data (hasKey $secret.data "ca.crt") -}}{{- $old = index $secret.data "ca.crt" | b64dec -}}{{- end -}}
{{- $made := "" -}}
{{- if $secret -}}{{- $made = index ($secret.metadata.annotations | default dict) "hami.io/tls-names" | default "" -}}{{- end -}}
{{- if and $old (eq $made $names) -}}
{{- $_ := set .Values "__hamiTLS" (dict "ca" $old "bundle" $old "crt" (index $secret.data "tls.crt" | b64dec) "key" (index $secret.data "tls.key" | b64dec) "names" $names) -}}
{{- else -}}
{{- $days := int .Values.scheduler.tls.validityDays -}}
{{- $ca := genCA (printf "%s-ca" (include "hami.scheduler" .)) $days -}}
{{- $want := $names | fromJson -}}
{{- $cert := genSignedCert (include "hami.scheduler" .) $want.ips $want.dns $days $ca -}}
{{- $bundle := $ca.Cert -}}
{{- if $old -}}{{- $bundle = printf "%s\n%s\n" (trim $ca.Cert) (trim $old) -}}{{- end -}}
{{- $_ := set .Values "__hamiTLS" (dict "ca" $ca.Cert "bundle" $bundle "crt" $cert.Cert "key" $cert.Key "names" $names) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami.scheduler.extenderClient" -}}{{ include "hami.scheduler" . }}-extender-client{{- end -}}

{{/* (hami-py) kube-scheduler in a Deployment and ServiceAccount of its own
(scheduler.kubeScheduler.separatePod): it calls the extender through the scheduler's Service. */}}
{{- define "hami.kubeScheduler.separate" -}}
{{- if and .Values.scheduler.kubeScheduler.enabled .Values.scheduler.kubeScheduler.separatePod -}}true{{- end -}}
{{- end -}}
{{- define "hami.kubeScheduler" -}}{{ include "hami.fullname" . }}-kube-scheduler{{- end -}}
{{- define "hami.kubeScheduler.selector" -}}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kube-scheduler
{{- end -}}

{{/* (hami-py) Whether the kube-scheduler the extender serves runs outside its pod: its own
Deployment (separatePod), or none of the chart's (kubeScheduler.enabled false: the cluster's own
scheduler, configured with the rendered ConfigMap's extender entry). The extender then campaigns
for a Lease of its own and is called through its Service with mTLS. */}}
{{- define "hami.extender.remote" -}}
{{- if or (not .Values.scheduler.kubeScheduler.enabled) .Values.scheduler.kubeScheduler.separatePod -}}true{{- end -}}
{{- end -}}

{{/* Whether kube-scheduler calls the extender over https (loopbackPort 0, or from outside the
pod): then with mTLS. */}}
{{- define "hami.extender.mtls" -}}
{{- if or (not (int .Values.scheduler.extender.loopbackPort)) (include "hami.extender.remote" .) -}}true{{- end -}}
{{- end -}}

{{/*
kube-scheduler's client certificate for /filter and /bind over https (loopbackPort 0), from a CA
of its own: the scheduler accepts no other certificate there (--extender-client-ca). Made once per
render, reused from the Secret on upgrade; the CA's key is never stored (nothing else is ever
signed by it). Not used with cert-manager (an Issuer makes them there).
*/}}
{{- define "hami.extenderClient.generate" -}}
{{- if not (hasKey .Values "__hamiClientTLS") -}}
{{- $secret := lookup "v1" "Secret" (include "hami.namespace" .) (include "hami.scheduler.extenderClient" .) -}}
{{- if and $secret $secret.data (hasKey $secret.data "ca.crt") -}}
{{- $_ := set .Values "__hamiClientTLS" (dict "ca" (index $secret.data "ca.crt" | b64dec) "crt" (index $secret.data "tls.crt" | b64dec) "key" (index $secret.data "tls.key" | b64dec)) -}}
{{- else -}}
{{- $days := int .Values.scheduler.tls.validityDays -}}
{{- $ca := genCA (printf "%s-ca" (include "hami.scheduler.extenderClient" .)) $days -}}
{{- $cert := genSignedCert "system:kube-scheduler:hami-extender-client" nil nil $days $ca -}}
{{- $_ := set .Values "__hamiClientTLS" (dict "ca" $ca.Cert "crt" $cert.Cert "key" $cert.Key) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The device plugin's, the DRA agent's and both monitors' mounts of devicePlugin.driverMounts (argument: .Values.devicePlugin) */}}
{{- define "hami.driverVolumeMounts" -}}
{{- range $i, $m := .driverMounts }}
- name: driver-{{ $i }}
  mountPath: {{ $m.containerPath | default $m.hostPath }}
  readOnly: {{ ne $m.readOnly false }}
{{- end }}
{{- end }}

{{/* The hostPath volumes of devicePlugin.driverMounts, named as hami.driverVolumeMounts mounts them (argument: .Values.devicePlugin) */}}
{{- define "hami.driverVolumes" -}}
{{- range $i, $m := .driverMounts }}
- name: driver-{{ $i }}
  hostPath:
    path: {{ $m.hostPath }}
    type: Directory
{{- end }}
{{- end }}

{{/* (hami-py) the webhook's front end, checked: extender | dra */}}
{{- define "hami.frontEnd" -}}
{{- $fe := .Values.frontEnd | default "extender" -}}
{{- if not (has $fe (list "extender" "dra")) -}}
{{- fail (printf "frontEnd: expected extender or dra, got %q" $fe) -}}
{{- end -}}
{{- if and (eq $fe "dra") (not .Values.dra.enabled) -}}
{{- fail "frontEnd: dra turns GPU pods into claims of the DeviceClass gpu.hami.io, which dra.enabled makes (with the node agent): set dra.enabled=true" -}}
{{- end -}}
{{- if and .Values.dra.enabled (not (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version)) -}}
{{- fail (printf "dra.enabled: the DRA driver needs resource.k8s.io/v1 (Kubernetes 1.34 or later; docs/dra.md), this cluster is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- $fe -}}
{{- end -}}

{{- define "hami.dra" -}}{{ include "hami.fullname" . }}-dra{{- end -}}
{{- /* (hami-py) `hami monitor` beside the DRA agent: a DaemonSet and ServiceAccount of its own (templates/monitor/) */}}
{{- define "hami.dra.monitor" -}}{{ include "hami.dra" . }}-monitor{{- end -}}

{{- define "hami.dra.selector" -}}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: hami-dra
{{- end -}}

{{- define "hami.dra.monitor.selector" -}}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: hami-dra-monitor
{{- end -}}

{{/* The pods behind the headless Service <release>-dra-monitor: the DRA agent's (port agent-metrics)
and the DRA monitor's (port metrics). Both pod templates carry app.kubernetes.io/part-of: hami-dra;
each Service port finds its named container port on one kind of pod only. */}}
{{- define "hami.dra.metrics.selector" -}}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: hami-dra
{{- end -}}

{{/* "true" when the DRA node monitor runs (its own DaemonSet, templates/monitor/): dra.enabled and
dra.monitor.enabled (it reads the claims' regions the DRA agent writes); "" otherwise */}}
{{- define "hami.dra.monitor.enabled" -}}
{{- if and .Values.dra.enabled .Values.dra.monitor.enabled -}}true{{- end -}}
{{- end -}}

{{/* The node monitors to run, a JSON list: "extender" (beside the device plugin, hami.monitor.enabled)
and "dra" (beside the DRA agent, hami.dra.monitor.enabled); both on a cluster that runs both agents */}}
{{- define "hami.monitors" -}}
{{- $on := list -}}
{{- if include "hami.monitor.enabled" . -}}{{- $on = append $on "extender" -}}{{- end -}}
{{- if include "hami.dra.monitor.enabled" . -}}{{- $on = append $on "dra" -}}{{- end -}}
{{- toJson $on -}}
{{- end -}}

{{/*
The pod-level settings of the DRA agent's DaemonSet and the DRA monitor's (both from dra.*): the
same nodes (nodeSelector, tolerations), node-critical priority, image pull secrets and the
runtime's default seccomp filter. Indent with nindent 6 under spec:.
*/}}
{{- define "hami.draNodePod" -}}
{{- $d := .Values.dra -}}
{{- include "hami.priorityClass" . }}
{{- include "hami.imagePullSecrets" . }}
{{- with $d.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $d.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- /* (review, 1 Dec) with the device plugin on too, never on its nodes: both agents would publish
the same GPUs and each front end hand them out without seeing the other's grants. A node lacking
any one of the plugin's nodeSelector labels is one the plugin does not run on (terms are ORed). */}}
{{- if and .Values.devicePlugin.enabled (not .Values.devicePlugin.nvidiaNodeSelector) }}
{{- /* (review, 1 Dec) no label tells the plugin's nodes apart: both agents would run on every node */}}
{{- fail "dra.enabled=true with devicePlugin.enabled=true needs a non-empty devicePlugin.nvidiaNodeSelector: with none, the device plugin and the DRA agent both run on every node and publish the same GPUs, each front end handing them out without seeing the other's grants. Label the DRA nodes apart and set devicePlugin.nvidiaNodeSelector (and dra.nodeSelector), or set devicePlugin.enabled=false (taints alone do not count: nothing in the chart keeps the device plugin off a tainted node you later tolerate)" }}
{{- end }}
{{- if and .Values.devicePlugin.enabled .Values.devicePlugin.nvidiaNodeSelector }}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
      {{- range $k, $v := .Values.devicePlugin.nvidiaNodeSelector }}
        - matchExpressions:
            - key: {{ $k | quote }}
              operator: NotIn
              values: [{{ $v | toString | quote }}]
      {{- end }}
{{- end }}
securityContext:
  seccompProfile:
    type: RuntimeDefault   # the runtime's default syscall filter, as the scheduler pod has
{{- end -}}

{{/* (hami-py) scheduler.ui.auth: token (default) or none; anything else fails the render */}}
{{- define "hami.ui.auth" -}}
{{- $auth := .Values.scheduler.ui.auth | default "token" -}}
{{- if not (has $auth (list "token" "none")) -}}
{{- fail (printf "scheduler.ui.auth: expected token or none, got %q" $auth) -}}
{{- end -}}
{{- $auth -}}
{{- end -}}

{{/* devicePlugin.injection, checked: allocate (HAMi's node lock protocol) or nri (docs/nri.md) */}}
{{- define "hami.injection" -}}
{{- $v := .injection | default "allocate" -}}
{{- if not (has $v (list "allocate" "nri")) -}}
{{- fail (printf "devicePlugin.injection must be allocate or nri, got %q" $v) -}}
{{- end -}}
{{- if and (eq $v "nri") (not (hasPrefix "/" (.nriSocket | default ""))) -}}
{{- fail (printf "devicePlugin.nriSocket must be an absolute host path with injection nri, got %q" (.nriSocket | default "")) -}}
{{- end -}}
{{- $v -}}
{{- end -}}

{{/* (hami-py) scheduler.ui.frameAncestors: "" when 'none' (the scheduler's default); a ';', ','
or line break would end the CSP directive: fails the render (the scheduler refuses it too) */}}
{{- define "hami.ui.frameAncestors" -}}
{{- $fa := .Values.scheduler.ui.frameAncestors | default "'none'" | trim -}}
{{- if regexMatch "[;,\r\n]" $fa -}}
{{- fail (printf "scheduler.ui.frameAncestors: %q holds ';', ',' or a line break; give the frame-ancestors sources only, separated by spaces" $fa) -}}
{{- end -}}
{{- if ne $fa "'none'" -}}{{ $fa }}{{- end -}}
{{- end -}}

{{/* (hami-py) the Secret (type kubernetes.io/tls) mounted for the UI's own certificate, or "" when
the UI uses the scheduler's serving certificate, is plain HTTP, or is off */}}
{{- define "hami.ui.tlsSecret" -}}
{{- $ui := .Values.scheduler.ui -}}
{{- if and $ui.enabled (eq (include "hami.ui.auth" .) "token") $ui.tls.enabled $ui.tls.secretName -}}
{{- $ui.tls.secretName -}}
{{- end -}}
{{- end -}}

{{/* (hami-py) the node monitor the UI's live usage reads through a hostPort: "extender" (the device
plugin's, <release>-vgpu-monitor) or "dra" (the DRA agent's, <release>-dra-monitor), while the UI is
on, scheduler.ui.liveUsage is true and scheduler.ui.monitorURL is empty (a monitor runs on the pod
network: its Service may answer with another node's monitor, so each node's own is reached at
<node InternalIP>:<port>); "" otherwise. One monitor only, so two never ask for the same hostPort
on one node: the extender's while it runs, else the DRA one's (a release running both monitors,
whose node sets may overlap, reads the extender's nodes only; docs/ui.md) */}}
{{- define "hami.ui.liveMonitor" -}}
{{- $ui := .Values.scheduler.ui -}}
{{- if and $ui.enabled (ne (toString $ui.liveUsage) "false") (not $ui.monitorURL) -}}
{{- if include "hami.monitor.enabled" . -}}extender
{{- else if include "hami.dra.monitor.enabled" . -}}dra
{{- end -}}
{{- end -}}
{{- end -}}

{{/* (hami-py) that monitor's hostPort, the same number as its metrics port:
devicePlugin.monitor.metricsPort or dra.monitor.metricsPort; "" without one (hami.ui.liveMonitor) */}}
{{- define "hami.ui.monitorHostPort" -}}
{{- $on := include "hami.ui.liveMonitor" . -}}
{{- if eq $on "extender" -}}{{- .Values.devicePlugin.monitor.metricsPort -}}
{{- else if eq $on "dra" -}}{{- .Values.dra.monitor.metricsPort -}}
{{- end -}}
{{- end -}}

{{/* (hami-py) the scheduler's --ui-monitor-url: scheduler.ui.monitorURL when set, else each node's
monitor through hami.ui.monitorHostPort, else "" (no live usage) */}}
{{- define "hami.ui.monitorURL" -}}
{{- $ui := .Values.scheduler.ui -}}
{{- if $ui.enabled -}}
{{- if $ui.monitorURL -}}
{{- $ui.monitorURL -}}
{{- else -}}
{{- with (include "hami.ui.monitorHostPort" .) -}}http://{node_ip}:{{ . }}/metrics{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* (hami-py) scheduler.ui.prometheusURL: the UI history's source; "" = the scheduler's ring */}}
{{- define "hami.ui.prometheusURL" -}}
{{- $url := .Values.scheduler.ui.prometheusURL | default "" | trim -}}
{{- if and $url (not (regexMatch "^https?://[^\\s?#@]+$" $url)) -}}
{{- fail (printf "scheduler.ui.prometheusURL: expected http(s)://host[:port][/path] with no query, fragment or user name, got %q" $url) -}}
{{- end -}}
{{- $url -}}
{{- end -}}

{{/* (hami-py) A Service's name, refused at render when over the 63 characters of a DNS label (the
API server would refuse the Service, and the release would be left failed). */}}
{{- define "hami.serviceName" -}}
{{- if gt (len .) 63 -}}
{{- fail (printf "the Service name %q is %d characters, over Kubernetes' 63: shorten the release name or set fullnameOverride" . (len .)) -}}
{{- end -}}
{{- . -}}
{{- end -}}

{{/* (hami-py) every pod's priorityClassName line (global.priorityClassName; "" for none). A release
upgraded with --reuse-values from a chart without the key has no value at all: then the class it
always had, not none. Indent as the pod spec's fields. */}}
{{- define "hami.priorityClass" -}}
{{- $pc := "system-node-critical" -}}
{{- if hasKey (.Values.global | default dict) "priorityClassName" -}}{{- $pc = .Values.global.priorityClassName -}}{{- end -}}
{{- with $pc -}}priorityClassName: {{ . }}{{- end -}}
{{- end -}}

{{/*
Non-empty when a container securityContext (the argument) holds CAP_SYS_ADMIN: privileged, or
capabilities.add naming SYS_ADMIN or ALL (any letter case, with or without CAP_, as the runtime
reads them). The NVIDIA container toolkit's legacy prestart hook refuses a container that sets
NVIDIA_MIG_MONITOR_DEVICES or NVIDIA_MIG_CONFIG_DEVICES without it ("cannot set MIG_MONITOR_DEVICES
in non privileged container"), so the container never starts (found by review, 1 Dec).
*/}}
{{- define "hami.holdsSysAdmin" -}}
{{- $sc := . | default dict -}}
{{- if eq (toString $sc.privileged) "true" -}}privileged{{- else -}}
{{- range (($sc.capabilities | default dict).add | default list) -}}
{{- if regexMatch "^(?i)(cap_)?(sys_admin|all)$" (toString .) -}}{{ . }}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Where the chart's values give the device plugin MIG work, as JSON {"mixed": WHERE, "dynamic": WHERE}
(WHERE: the value that asks for it, "" when none): static MIG (migstrategy mixed: it lists the MIG
instances, which needs the MIG monitor capability) and dynamic MIG (operatingmode mig: it turns MIG
mode on and makes instances, which needs the MIG config capability too). The strategy is the
plugin's: its last --mig-strategy (devicePlugin.migStrategy, then devicePlugin.extraArgs), else
devicePlugin.extraEnvs.MIG_STRATEGY, else each node's config.json entry. A ConfigMap named by
nodeConfiguration.externalConfigName is not the chart's: what it says is not known here.
*/}}
{{- define "hami.devicePlugin.mig" -}}
{{- $dp := .Values.devicePlugin -}}
{{- include "hami.mig" (dict "Values" .Values "args" ($dp.extraArgs | default list) "argsAt" "devicePlugin.extraArgs" "envs" ($dp.extraEnvs | default dict)) -}}
{{- end -}}

{{/*
The same for the DRA agent (templates/dra/): it reads devicePlugin.migStrategy, then its own
dra.extraArgs, and config.json; never the device plugin's extraArgs or extraEnvs (the regression
review of 1 Dec: SYS_ADMIN followed the plugin's flags, which the agent does not run with).
*/}}
{{- define "hami.dra.mig" -}}
{{- include "hami.mig" (dict "Values" .Values "args" (.Values.dra.extraArgs | default list) "argsAt" "dra.extraArgs" "envs" dict) -}}
{{- end -}}

{{/* hami.devicePlugin.mig's work, from a dict: Values, args (the program's extra arguments, named
argsAt in the notes) and envs (its extra environment). */}}
{{- define "hami.mig" -}}
{{- $dp := .Values.devicePlugin -}}
{{- $flag := "" -}}
{{- $flagFrom := "" -}}
{{- with $dp.migStrategy -}}{{- $flag = toString . -}}{{- $flagFrom = printf "devicePlugin.migStrategy=%s" $flag -}}{{- end -}}
{{- $args := .args -}}
{{- $argsAt := .argsAt -}}
{{- range $i, $a := $args -}}
{{- $a = toString $a -}}
{{- if hasPrefix "--mig-strategy=" $a -}}
{{- $flag = trimPrefix "--mig-strategy=" $a -}}{{- $flagFrom = printf "%s[%d]=%s" $argsAt $i $a -}}
{{- else if and (eq $a "--mig-strategy") (lt (add1 $i) (len $args)) -}}
{{- $flag = toString (index $args (add1 $i)) -}}{{- $flagFrom = printf "%s[%d]=--mig-strategy %s" $argsAt $i $flag -}}
{{- end -}}
{{- end -}}
{{- if and (not $flagFrom) (hasKey .envs "MIG_STRATEGY") -}}
{{- $flag = toString (index .envs "MIG_STRATEGY") -}}{{- $flagFrom = printf "devicePlugin.extraEnvs.MIG_STRATEGY=%s" $flag -}}
{{- end -}}
{{- $mixed := "" -}}
{{- $dynamic := "" -}}
{{- if eq $flag "mixed" -}}{{- $mixed = $flagFrom -}}{{- end -}}
{{- if not $dp.nodeConfiguration.externalConfigName -}}
{{- $doc := ($dp.nodeConfiguration.config | default "{}") | fromJson -}}
{{- /* the top-level key in any case too, as the programs read config.json (node/settings.py) */ -}}
{{- $entries := list -}}
{{- if kindIs "map" $doc -}}
{{- range $k, $v := $doc -}}{{- if eq (lower $k) "nodeconfig" -}}{{- $entries = $v -}}{{- end -}}{{- end -}}
{{- end -}}
{{- if kindIs "slice" $entries -}}
{{- range $i, $e := $entries -}}
{{- if kindIs "map" $e -}}
{{- $node := "" -}}
{{- range $k, $v := $e -}}{{- if eq (lower $k) "name" -}}{{- $node = toString $v -}}{{- end -}}{{- end -}}
{{- range $k, $v := $e -}}
{{- $where := printf "devicePlugin.nodeConfiguration.config nodeconfig[%d] (node %q): %s=%v" $i $node $k $v -}}
{{- if and (eq (lower $k) "operatingmode") (eq (toString $v) "mig") (not $dynamic) -}}{{- $dynamic = $where -}}{{- end -}}
{{- if and (eq (lower $k) "migstrategy") (eq (toString $v) "mixed") (not $flagFrom) (not $mixed) -}}{{- $mixed = $where -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- dict "mixed" $mixed "dynamic" $dynamic | toJson -}}
{{- end -}}
