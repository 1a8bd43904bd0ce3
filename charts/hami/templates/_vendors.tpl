{{/*
Vendors: which device backends this release serves, and every extended-resource name they read.

One source of truth: the device-config.yaml the scheduler and the device plugin load
("hami.deviceConfig": device-config.content when set, else generated from .Values.devices).
"hami.managedResources" parses that text and resolves each enabled section's resource names with
the defaults of src/hami/config.py ("hami.resourceDefaults"), so kube-scheduler hands exactly
these names to the extender. A section is enabled as hami.config reads it: a mapping section
when its key is present with a mapping value (even {}), iluvatars when it is a non-empty list.
tests/integration/test_chart_vendors.py keeps this list equal to hami.vendors.managed_resource_names.
*/}}

{{/* Resource-name keys of each mapping section and their defaults (src/hami/config.py). */}}
{{- define "hami.resourceDefaults" -}}
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
cambricon:
  resourceCountName: cambricon.com/vmlu
  resourceMemoryName: cambricon.com/mlu.smlu.vmemory
  resourceCoreName: cambricon.com/mlu.smlu.vcore
hygon:
  resourceCountName: hygon.com/dcunum
  resourceMemoryName: hygon.com/dcumem
  resourceCoreName: hygon.com/dcucores
metax:
  resourceCountName: metax-tech.com/gpu
  resourceVCountName: metax-tech.com/sgpu
  resourceVMemoryName: metax-tech.com/vmemory
  resourceVCoreName: metax-tech.com/vcore
mthreads:
  resourceCountName: mthreads.com/vgpu
  resourceMemoryName: mthreads.com/sgpu-memory
  resourceCoreName: mthreads.com/sgpu-core
enflame:
  resourceNameGCU: enflame.com/gcu
  resourceNameDRSGCU: enflame.com/drs-gcu
  resourceNameGCUMemory: enflame.com/gcu-memory
  resourceNameGCUCore: enflame.com/gcu-core
kunlun:
  resourceCountName: kunlunxin.com/xpu
  resourceVCountName: kunlunxin.com/vxpu
  resourceVMemoryName: kunlunxin.com/vxpu-memory
awsneuron:
  resourceCountName: aws.amazon.com/neuron
  resourceCoreName: aws.amazon.com/neuroncore
amd:
  resourceCountName: amd.com/gpu
  resourceMemoryName: amd.com/gpumem
  resourceCoreName: amd.com/gpucores
vastai:
  resourceCountName: vastaitech.com/va
biren:
  resourceCountName: birentech.com/gpu
{{- end -}}

{{/* The chart's Iluvatar chips (iluvatars: [] in values = these) and Ascend chips (vnpus.configs empty). */}}
{{- define "hami.iluvatarDefaults" -}}
{{- $out := list -}}
{{- range list "MR-V100" "MR-V50" "BI-V150" "BI-V100" -}}
{{- $out = append $out (dict "chipName" . "commonWord" . "resourceCountName" (printf "iluvatar.ai/%s-vgpu" .) "resourceMemoryName" (printf "iluvatar.ai/%s.vMem" .) "resourceCoreName" (printf "iluvatar.ai/%s.vCore" .)) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- define "hami.ascendCommonWords" -}}
{{- list "Ascend910A" "Ascend910B2" "Ascend910B3" "Ascend910B4-1" "Ascend910B4" "Ascend310P" "Ascend910C" | toJson -}}
{{- end -}}

{{/* The nvidia section generated from the chart's values (as before vendors were configurable). */}}
{{- define "hami.nvidiaSection" -}}
resourceCountName: {{ .Values.resourceName }}
resourceMemoryName: {{ .Values.resourceMem }}
resourceMemoryPercentageName: {{ .Values.resourceMemPercentage }}
resourceCoreName: {{ .Values.resourceCores }}
resourcePriorityName: {{ .Values.resourcePriority }}
overwriteEnv: {{ include "hami.scheduler.overwriteEnv" . }}
defaultMemory: 0
defaultCores: 0
defaultGPUNum: 1
deviceSplitCount: {{ .Values.devicePlugin.deviceSplitCount }}
deviceMemoryScaling: {{ .Values.devicePlugin.deviceMemoryScaling }}
deviceCoreScaling: {{ .Values.devicePlugin.deviceCoreScaling }}
preConfiguredDeviceMemory: {{ .Values.devicePlugin.preConfiguredDeviceMemory }}
enableNumaTopology: {{ .Values.devicePlugin.enableNumaTopology }}
disableCoreLimit: {{ .Values.devicePlugin.disablecorelimit }}
gpuCorePolicy: {{ .Values.devices.nvidia.gpuCorePolicy }}
libCudaLogLevel: {{ .Values.devices.nvidia.libCudaLogLevel }}
runtimeClassName: {{ .Values.devicePlugin.runtimeClassName | quote }}
{{- end -}}

{{/* HAMi's scheduler.overwriteEnv (a string in HAMi's values, "false"): the nvidia section's overwriteEnv
     (containers without a GPU get NVIDIA_VISIBLE_DEVICES=none), as HAMi's device-config is made */}}
{{- define "hami.scheduler.overwriteEnv" -}}
{{- $v := toString (.Values.scheduler.overwriteEnv | default "false") | lower -}}
{{- if not (has $v (list "true" "false")) -}}
{{- fail (printf "scheduler.overwriteEnv: expected true or false, got %q" $v) -}}
{{- end -}}
{{- $v -}}
{{- end -}}

{{/* The keys of devices.<section> that are not the chart's own: HAMi's newer layout gives a vendor's
     device-config keys there (devices.nvidia.deviceSplitCount, devices.hygon.resourceCountName), so
     they are keys of that section; "true"/"false" strings are read as booleans, nulls left out */}}
{{- define "hami.devicesSectionKeys" -}}
{{- $out := dict -}}
{{- range $k, $v := omit (.devices | default dict) "enabled" "config" "devicePluginUsers" "customresources" "createRuntimeClass" "runtimeClassName" -}}
{{- if not (kindIs "invalid" $v) -}}
{{- if and (kindIs "string" $v) (has (lower $v) (list "true" "false")) -}}{{- $v = eq (lower $v) "true" -}}{{- end -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The nvidia section: from devicePlugin.* and the top-level resource names (HAMi's older layout),
     under devices.nvidia's own keys (HAMi's newer layout), under devices.nvidia.config. The figures
     the scheduler refuses at start (src/hami/config.py) are refused here, naming the key they came
     from, so the install fails instead of the pods. */}}
{{- define "hami.nvidiaConfig" -}}
{{- $n := .Values.devices.nvidia -}}
{{- $own := include "hami.devicesSectionKeys" (dict "devices" $n) | fromJson -}}
{{- $config := $n.config | default dict -}}
{{- $merged := mergeOverwrite (include "hami.nvidiaSection" . | fromYaml) $own (deepCopy $config) -}}
{{- range $k := list "deviceSplitCount" "deviceMemoryScaling" "deviceCoreScaling" -}}
{{- $src := printf "devicePlugin.%s" $k -}}
{{- if hasKey $own $k -}}{{- $src = printf "devices.nvidia.%s" $k -}}{{- end -}}
{{- if hasKey $config $k -}}{{- $src = printf "devices.nvidia.config.%s" $k -}}{{- end -}}
{{- $v := index $merged $k -}}
{{- if eq $k "deviceSplitCount" -}}
{{- if or (lt (int64 $v) 1) (gt (int64 $v) 1024) -}}
{{- fail (printf "%s: expected 1 to 1024 tasks per GPU, got %v" $src $v) -}}
{{- end -}}
{{- else if or (le (float64 $v) 0.0) (gt (float64 $v) 1000.0) -}}
{{- fail (printf "%s: expected a number above 0 and at most 1000, got %v" $src $v) -}}
{{- end -}}
{{- end -}}
{{- toYaml $merged -}}
{{- end -}}

{{/* HAMi's older layout: vendor resource names at the top level of values.yaml, and the key of the
     vendor's device-config section each one is */}}
{{- define "hami.topLevelVendorKeys" -}}
cambricon: {mluResourceName: resourceCountName, mluResourceMem: resourceMemoryName, mluResourceCores: resourceCoreName}
hygon: {hcuResourceName: resourceCountName, hcuResourceMem: resourceMemoryName, hcuResourceCores: resourceCoreName}
metax: {metaxResourceName: resourceVCountName, metaxResourceCore: resourceVCoreName, metaxResourceMem: resourceVMemoryName, metaxsGPUTopologyAware: sgpuTopologyAware}
enflame: {enflameResourceNameDRSGCU: resourceNameDRSGCU, enflameResourceNameGCUMemory: resourceNameGCUMemory, enflameResourceNameGCUCore: resourceNameGCUCore}
kunlun: {kunlunResourceName: resourceCountName, kunlunResourceVCountName: resourceVCountName, kunlunResourceVMemoryName: resourceVMemoryName}
vastai: {vastaiResourceName: resourceCountName}
biren: {birenResourceName: resourceCountName}
{{- end -}}

{{/* Values HAMi's chart ships for a vendor section where they differ from hami.resourceDefaults
     (its hygon names are hcu*, the code's dcu*): a copied HAMi values file holds them */}}
{{- define "hami.hamiChartVendorDefaults" -}}
hygon: {resourceCountName: hygon.com/hcunum, resourceMemoryName: hygon.com/hcumem, resourceCoreName: hygon.com/hcucores, memoryFactor: 1}
metax: {sgpuTopologyAware: false}
mthreads: {memoryPerCard: [96]}
{{- end -}}

{{/* A vendor section's keys given in HAMi's places ({key: {from: <the value's name>, value: ...}}):
     the top-level names of the older layout, then devices.<section>'s own keys (the newer one) */}}
{{- define "hami.hamiVendorKeys" -}}
{{- $root := .root -}}
{{- $out := dict -}}
{{- range $top, $key := index (include "hami.topLevelVendorKeys" $root | fromYaml) .section | default dict -}}
{{- $v := index $root.Values $top -}}
{{- if not (kindIs "invalid" $v) -}}
{{- if and (kindIs "string" $v) (has (lower $v) (list "true" "false")) -}}{{- $v = eq (lower $v) "true" -}}{{- end -}}
{{- $_ := set $out $key (dict "from" $top "value" $v) -}}
{{- end -}}
{{- end -}}
{{- range $key, $v := include "hami.devicesSectionKeys" (dict "devices" (index $root.Values.devices .section)) | fromJson -}}
{{- $_ := set $out $key (dict "from" (printf "devices.%s.%s" $.section $key) "value" $v) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* device-config.yaml: device-config.content, or one section per enabled entry of .Values.devices. */}}
{{- define "hami.deviceConfig" -}}
{{- $content := (index .Values "device-config").content -}}
{{- if $content -}}
{{ $content }}
{{- else -}}
{{- $defaults := include "hami.resourceDefaults" . | fromYaml -}}
{{- $devices := .Values.devices -}}
{{- if $devices.nvidia.enabled }}
nvidia:
{{ include "hami.nvidiaConfig" . | indent 2 }}
{{- end }}
{{- range $section := list "cambricon" "hygon" "metax" "mthreads" "enflame" "kunlun" "awsneuron" "amd" "vastai" "biren" }}
{{- $v := index $devices $section | default dict }}
{{- if $v.enabled }}
{{- $body := deepCopy ($v.config | default dict) }}
{{- /* HAMi's places for the section's keys (hami.hamiVendorKeys), under config */}}
{{- range $key, $h := include "hami.hamiVendorKeys" (dict "root" $ "section" $section) | fromJson }}
{{- if not (hasKey $body $key) }}{{ $_ := set $body $key $h.value }}{{ end }}
{{- end }}
{{- range $key, $default := index $defaults $section }}
{{- if not (hasKey $body $key) }}{{ $_ := set $body $key $default }}{{ end }}
{{- end }}
{{- /* HAMi's customresources: names kube-scheduler hands to the extender. One the section does not
read would be placed by the extender without being counted: refused */}}
{{- $names := list }}
{{- range $key := keys (index $defaults $section) }}{{ $names = append $names (toString (index $body $key)) }}{{ end }}
{{- range $name := $v.customresources | default list }}
{{- if not (has (toString $name) $names) }}
{{- fail (printf "devices.%s.customresources: %s is not one of the %s section's resource names (%s): the extender would place pods asking for it without counting it; name it in the section's resource-name keys (devices.%s.config) instead" $section $name $section (join ", " ($names | compact | sortAlpha)) $section) }}
{{- end }}
{{- end }}
{{ $section }}:
{{ $body | toYaml | indent 2 }}
{{- end }}
{{- end }}
{{- with $devices.iluvatars }}{{ if .enabled }}
iluvatars:
{{ .config | default (include "hami.iluvatarDefaults" $ | fromJsonArray) | toYaml | indent 2 }}
{{- end }}{{ end }}
{{- with $devices.vnpus }}{{ if .enabled }}
vnpus:
{{ merge (deepCopy (.config | default dict)) (dict "hamiVnpuCore" false "configs" list) | toYaml | indent 2 }}
{{- end }}{{ end }}
{{- end -}}
{{- end -}}

{{/* Every resource name of every enabled vendor (a JSON list, sorted, no duplicates). */}}
{{- define "hami.managedResources" -}}
{{- $cfg := include "hami.deviceConfig" . | fromYaml -}}
{{- if hasKey $cfg "Error" -}}{{- fail (printf "device-config.yaml is not valid YAML: %s" $cfg.Error) -}}{{- end -}}
{{- $defaults := include "hami.resourceDefaults" . | fromYaml -}}
{{- $names := list -}}
{{- range $section, $keys := $defaults -}}
{{- $s := index $cfg $section -}}
{{- if kindIs "map" $s -}}
{{- range $key, $default := $keys -}}
{{- $v := ternary (index $s $key) $default (hasKey $s $key) -}}
{{- if $v -}}{{- $names = append $names (toString $v) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $chips := list -}}
{{- if kindIs "slice" $cfg.iluvatars -}}{{- $chips = concat $chips $cfg.iluvatars -}}{{- end -}}
{{- if kindIs "map" $cfg.vnpus -}}
{{- if $cfg.vnpus.configs -}}
{{- range $cfg.vnpus.configs -}}
{{- $chips = append $chips (dict "resourceCountName" .resourceName "resourceMemoryName" .resourceMemoryName "resourceCoreName" .resourceCoreName) -}}
{{- end -}}
{{- else -}}
{{- range (include "hami.ascendCommonWords" . | fromJsonArray) -}}
{{- $chips = append $chips (dict "resourceCountName" (printf "huawei.com/%s" .) "resourceMemoryName" (printf "huawei.com/%s-memory" .) "resourceCoreName" (printf "huawei.com/%s-core" .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $chip := $chips -}}
{{- range $key := list "resourceCountName" "resourceMemoryName" "resourceCoreName" -}}
{{- $v := index $chip $key -}}
{{- if $v -}}{{- $names = append $names (toString $v) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/*
The annotations each vendor section's decision writes besides the hami.io/ allocation pair, as
src/hami/vendors/ spells them (BaseVendor.decision_annotations): that vendor's own device plugin reads
them at Allocate (which slice, profile or cores the pod gets), so the allocation guard keeps them
as it keeps the pair. vnpus: one huawei.com/<commonWord> per chip (written "huawei.com/{chip}" here).
nvidia's hami.io/vgpu-mig-allocations is in the guard's own list. tests/integration/test_chart_vendors.py
keeps these equal to the vendors' lists.
*/}}
{{- define "hami.decisionAnnotationKeys" -}}
cambricon: [CAMBRICON_DSMLU_PROFILE, CAMBRICON_DSMLU_ASSIGNED, CAMBRICON_DSMLU_ASSIGHED]
metax: [metax-tech.com/gpu-devices-allocated, metax-tech.com/predicate-time]
mthreads: [mthreads.com/gpu-index, mthreads.com/predicate-time, mthreads.com/predicate-node]
enflame:
  - enflame.com/gcu-request-size
  - enflame.com/gcu-assigned-id
  - enflame.com/gcu-assigned
  - enflame.com/gcu-assigned-index
  - enflame.com/gcu-assigned-minor
  - enflame.com/gcu-assigned-time
  - assigned-containers
kunlun: [BAIDU_COM_DEVICE_IDX]
awsneuron: [AWS_NEURON_IDS, NEURON_ALLOC_TIME, NEURON_ALLOCATED, NEURON_RESOURCE_TYPE, aws.amazon.com/predicate-node]
vnpus: ["huawei.com/{chip}", predicate-time]
{{- end -}}

{{/* The decision annotations of every vendor enabled in device-config.yaml (a JSON list, sorted),
     enabled as "hami.managedResources" reads the sections. */}}
{{- define "hami.decisionAnnotations" -}}
{{- $cfg := include "hami.deviceConfig" . | fromYaml -}}
{{- $keys := list -}}
{{- range $section, $names := include "hami.decisionAnnotationKeys" . | fromYaml -}}
{{- $s := index $cfg $section -}}
{{- if kindIs "map" $s -}}
{{- $chips := list -}}
{{- if eq $section "vnpus" -}}
{{- range ($s.configs | default list) -}}{{- $chips = append $chips (toString .commonWord) -}}{{- end -}}
{{- if not $chips -}}{{- $chips = include "hami.ascendCommonWords" $ | fromJsonArray -}}{{- end -}}
{{- end -}}
{{- range $name := $names -}}
{{- if contains "{chip}" $name -}}
{{- range $chip := $chips -}}{{- $keys = append $keys (replace "{chip}" $chip $name) -}}{{- end -}}
{{- else -}}
{{- $keys = append $keys $name -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $keys | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* Identities of the enabled vendors' own device plugins (devices.<vendor>.devicePluginUsers). */}}
{{- define "hami.vendorPluginUsers" -}}
{{- $users := list -}}
{{- range $name, $v := .Values.devices -}}
{{- if and (kindIs "map" $v) $v.enabled -}}
{{- $users = concat $users ($v.devicePluginUsers | default list) -}}
{{- end -}}
{{- end -}}
{{- $users | uniq | toJson -}}
{{- end -}}

{{/* The toolkit-validation init container's script (a test runs it against a directory of its own). */}}
{{- define "hami.toolkitWait" -}}
until [ -f /run/nvidia/validations/toolkit-ready ]; do echo "Waiting for /run/nvidia/validations/toolkit-ready..."; sleep 2; done; echo "toolkit ready"
{{- end -}}

{{/*
HAMi chart values this chart does not implement: set, they stop the install with one line naming
the value, instead of being accepted and ignored (docs/configuration.md).
*/}}
{{- define "hami.refuseUnsupported" -}}
{{- $dp := .Values.devicePlugin -}}
{{- range $key, $why := dict
    "gdrcopyEnabled" "GPUDirect RDMA (NVIDIA_GDRCOPY) is not injected by this device plugin"
    "gdsEnabled" "GPUDirect Storage (NVIDIA_GDS) is not injected by this device plugin"
    "mofedEnabled" "MOFED (NVIDIA_MOFED) is not injected by this device plugin"
    "nvidiaHookPath" "the NVIDIA CDI hook is not used; see devicePlugin.deviceListStrategy"
    "runtimeType" "the container runtime is not configured by this chart" -}}
{{- if and (hasKey $dp $key) (index $dp $key) -}}
{{- fail (printf "devicePlugin.%s=%v is not supported by this chart: %s (docs/configuration.md)" $key (index $dp $key) $why) -}}
{{- end -}}
{{- end -}}
{{- /* HAMi's "auto" (GPU Operator's driver-ready contract, else /) and "/" both mean the driver the
NVIDIA container runtime injects, which is what this chart assumes: no override */ -}}
{{- if and $dp.nvidiaDriverRoot (not (has (toString $dp.nvidiaDriverRoot) (list "auto" "/"))) -}}
{{- fail (printf "devicePlugin.nvidiaDriverRoot=%v is not supported by this chart: use devicePlugin.driverMounts for a driver outside the NVIDIA container runtime (docs/configuration.md)" $dp.nvidiaDriverRoot) -}}
{{- end -}}
{{- if $dp.passDeviceSpecsEnabled -}}
{{- if eq (include "hami.injection" $dp) "nri" -}}
{{- fail "devicePlugin.passDeviceSpecsEnabled=true cannot go with devicePlugin.injection=nri (Allocate does not know the GPUs in that mode)" -}}
{{- end -}}
{{- if not (isAbs (toString ($dp.devRoot | default "/"))) -}}
{{- fail (printf "devicePlugin.devRoot=%v: expected an absolute host path" $dp.devRoot) -}}
{{- end -}}
{{- end -}}
{{- $vgpu := printf "%s/vgpu" (trimSuffix "/" .Values.global.gpuHookPath) -}}
{{- if and $dp.libPath (ne (trimSuffix "/" $dp.libPath) $vgpu) -}}
{{- fail (printf "devicePlugin.libPath=%s is not supported: libvgpu lives in <global.gpuHookPath>/vgpu (%s here); set global.gpuHookPath instead" $dp.libPath $vgpu) -}}
{{- end -}}
{{- /* the regions live where the device plugin writes them, <hook>/vgpu/containers: a monitor pointed
elsewhere would read a directory nothing writes */ -}}
{{- $regions := printf "%s/containers" $vgpu -}}
{{- range $name, $path := dict "devicePlugin.monitor.ctrPath" (($dp.monitor | default dict).ctrPath) "devicePlugin.monitorctrPath" $dp.monitorctrPath -}}
{{- if and $path (ne (trimSuffix "/" (toString $path)) $regions) -}}
{{- fail (printf "%s=%s is not supported: the device plugin writes the regions to <global.gpuHookPath>/vgpu/containers (%s here) and the monitor reads them there; set global.gpuHookPath instead" $name $path $regions) -}}
{{- end -}}
{{- end -}}
{{- include "hami.refuseHamiOnly" . -}}
{{- if and .Values.devices.ascend (kindIs "map" .Values.devices.ascend) .Values.devices.ascend.enabled -}}
{{- fail "devices.ascend.enabled=true is HAMi's name: set devices.vnpus.enabled=true (and devices.vnpus.devicePluginUsers for the Ascend plugin's identity)" -}}
{{- end -}}
{{- if (index .Values "device-config").content -}}
{{- range $name, $v := .Values.devices -}}
{{- if and (ne $name "nvidia") (kindIs "map" $v) $v.enabled -}}
{{- fail (printf "devices.%s.enabled=true has no effect with device-config.content set: put the %s section in that content" $name $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $dls := $dp.deviceListStrategy | default "envvar" -}}
{{- if not (has $dls (list "envvar" "cdi-annotations" "cdi-cri")) -}}
{{- fail (printf "devicePlugin.deviceListStrategy=%v is not supported: expected envvar, cdi-annotations or cdi-cri" $dls) -}}
{{- end -}}
{{- /* a surge pod is a second plugin on the node while the first runs: it fails its preflight check,
and the old one's exit removes the new one's socket */ -}}
{{- $ru := ($dp.updateStrategy | default dict).rollingUpdate | default dict -}}
{{- if and (kindIs "map" $ru) (not (has (toString ($ru.maxSurge | default 0)) (list "0" "0%"))) -}}
{{- fail (printf "devicePlugin.updateStrategy.rollingUpdate.maxSurge=%v is not supported: a surge pod would be a second device plugin on the node, which fails its preflight check and loses its socket when the old one exits; use maxUnavailable" $ru.maxSurge) -}}
{{- end -}}
{{- end -}}

{{/* The value at a dotted path of .values as JSON, or "" when a key on the way is missing. */}}
{{- define "hami.valueAt" -}}
{{- $cur := .values -}}
{{- $found := true -}}
{{- range $k := splitList "." .path -}}
{{- if and $found (kindIs "map" $cur) (hasKey $cur $k) -}}{{- $cur = index $cur $k -}}{{- else -}}{{- $found = false -}}{{- end -}}
{{- end -}}
{{- if $found -}}{{- toJson $cur -}}{{- end -}}
{{- end -}}

{{/*
HAMi chart values with no counterpart here. Unset, or at HAMi's own default (a copied HAMi values
file holds them all), they change nothing in HAMi's chart either; any other value stops the install
with one line naming it and what to do, instead of being accepted and ignored (docs/configuration.md).
Each row: the value, the JSON forms that are HAMi's default (its own or a string of it), why.
*/}}
{{- define "hami.refuseHamiOnly" -}}
{{- $off := list "null" "false" "\"false\"" "\"\"" -}}
{{- range $row := list
  (list "platform.openshift" $off "OpenShift SecurityContextConstraints are not made by this chart; grant an SCC to its service accounts yourself (its pods need no privilege)")
  (list "selinux.enabled" $off "host directories are not relabelled by this chart")
  (list "podSecurityPolicy.enabled" $off "PodSecurityPolicy was removed in Kubernetes 1.25; use Pod Security admission")
  (list "mockDevicePlugin.enabled" $off "there is no mock device plugin in this chart")
  (list "scheduler.networkPolicy.enabled" $off "no NetworkPolicy is rendered, and the Service's port serves no unauthenticated /filter or /bind")
  (list "scheduler.admissionWebhook.manageNamespaceSelector" (list "null" "true" "\"true\"") "the webhook's namespaceSelector is always rendered: whitelistNamespaces and the hami.io/webhook=ignore exclusion live in it")
  (list "scheduler.service.monitorTargetPort" (list "null" "\"metrics\"" "\"\"") "the metrics Service always targets the container port named metrics (scheduler.metricsBindAddress)")
  (list "scheduler.extenderPort" (list "null" "9444" "\"9444\"" "\"\"") "set scheduler.extender.loopbackPort, this chart's loopback port for /filter and /bind")
  (list "devicePlugin.hostPIDBroker.enabled" $off "the device plugin serves no host PID broker: the monitor matches processes through the regions, never host PIDs")
  (list "devicePlugin.numaRefit.enabled" $off "NUMA alignment refit is not implemented")
  (list "devicePlugin.reportNodeCapacity" $off "GPU memory and cores are not reported as node capacity")
  (list "devicePlugin.vgpuCache.gracePeriod" (list "null" "\"5m\"" "\"\"") "a gone pod's directory is removed after devicePlugin.monitor.resyncInterval; set that instead")
  (list "devicePlugin.monitor.securityContext" (list "null" "{}" "{\"allowPrivilegeEscalation\":false,\"capabilities\":{\"add\":[\"SYS_ADMIN\"],\"drop\":[\"ALL\"]}}") "the monitor runs with a securityContext of its own, unprivileged")
  (list "devicePlugin.gpuOperatorToolkitReady.securityContext" (list "null" "{}" "{\"privileged\":true,\"runAsUser\":0}") "the toolkit wait runs with a securityContext of its own, unprivileged")
  (list "devices.iluvatar.enabled" $off "HAMi's name: set devices.iluvatars.enabled=true")
  (list "devices.remotegpu.enabled" $off "remote GPUs (lupine) are not supported")
  (list "devices.nvidia.runtimeClassName" (list "null" "\"\"") "set devicePlugin.runtimeClassName (the device plugin's, the monitor's and GPU pods' RuntimeClass)")
  (list "devices.nvidia.createRuntimeClass" $off "set devicePlugin.createRuntimeClass")
  (list "metaxsGPUTopologyAware" $off "MetaX sGPU topology-aware placement is not supported")
  (list "devices.metax.sgpuTopologyAware" $off "MetaX sGPU topology-aware placement is not supported")
-}}
{{- $got := include "hami.valueAt" (dict "values" $.Values "path" (index $row 0)) -}}
{{- if and $got (not (has $got (index $row 1))) -}}
{{- fail (printf "%s=%s is not supported by this chart: %s (docs/configuration.md)" (index $row 0) $got (index $row 2)) -}}
{{- end -}}
{{- end -}}
{{- /* HAMi's own image (its Go programs; a copied HAMi values file names it for every component):
it has no `hami` command, so every pod would crash-loop after an install that looked fine */ -}}
{{- range $key := list "scheduler.extender.image" "devicePlugin.image" "devicePlugin.monitor.image" "dra.image" -}}
{{- $image := include "hami.valueAt" (dict "values" $.Values "path" $key) | default "{}" | fromJson -}}
{{- $repo := toString ($image.repository | default "") -}}
{{- if or (eq $repo "projecthami/hami") (hasSuffix "/projecthami/hami" $repo) -}}
{{- fail (printf "%s.repository=%s is HAMi's image, which has none of this chart's programs (its pods would crash-loop): remove the image keys copied from HAMi's values (%s.registry, .repository, .tag and global.imageTag) to use this chart's image (docs/configuration.md)" $key $repo $key) -}}
{{- end -}}
{{- end -}}
{{- /* HAMi's client-side limits (its defaults: 5 QPS, burst 10): the scheduler's API client has no
such limit, so a higher one holds as set; a lower one cannot be kept */ -}}
{{- range $key, $floor := dict "kubeQPS" 5 "kubeBurst" 10 -}}
{{- $v := toString (index $.Values.scheduler $key | default "") -}}
{{- if and $v (or (not (regexMatch "^[0-9]+(\\.[0-9]+)?$" $v)) (lt (float64 $v) (float64 $floor))) -}}
{{- fail (printf "scheduler.%s=%s is not supported by this chart: the scheduler's API client has no client-side rate limit, so only a limit of at least HAMi's default (%v) is met; remove the key (docs/configuration.md)" $key $v $floor) -}}
{{- end -}}
{{- end -}}
{{- /* HAMi's kubeTimeout: seconds, 0 = none; the scheduler always times a request out (30s unless set) */ -}}
{{- with include "hami.valueAt" (dict "values" .Values "path" "scheduler.kubeTimeout") | trimAll "\"" | replace "null" "" -}}
{{- if not (regexMatch "^[1-9][0-9]*$" .) -}}
{{- fail (printf "scheduler.kubeTimeout=%s is not supported by this chart: expected a whole number of seconds above 0 (an API request always times out here, after 30s when unset) (docs/configuration.md)" .) -}}
{{- end -}}
{{- end -}}
{{- /* a vendor's keys given in HAMi's places while the vendor is off here: HAMi's chart serves every
vendor, this one only those enabled */ -}}
{{- $defaults := include "hami.resourceDefaults" . | fromYaml -}}
{{- $hamiDefaults := include "hami.hamiChartVendorDefaults" . | fromYaml -}}
{{- range $section := list "cambricon" "hygon" "metax" "mthreads" "enflame" "kunlun" "awsneuron" "amd" "vastai" "biren" -}}
{{- if not (index $.Values.devices $section | default dict).enabled -}}
{{- range $key, $h := include "hami.hamiVendorKeys" (dict "root" $ "section" $section) | fromJson -}}
{{- $v := toJson $h.value -}}
{{- $same := list (toJson (index (index $defaults $section | default dict) $key)) (toJson (index (index $hamiDefaults $section | default dict) $key)) -}}
{{- if not (has $v $same) -}}
{{- fail (printf "%s=%s has no effect while devices.%s.enabled is false: this chart serves a vendor only when it is enabled; set devices.%s.enabled=true (docs/configuration.md)" $h.from $v $section $section) -}}
{{- end -}}
{{- end -}}
{{- $names := values (index $defaults $section | default dict) | toStrings -}}
{{- range $name := (index $.Values.devices $section | default dict).customresources | default list -}}
{{- if not (has (toString $name) $names) -}}
{{- fail (printf "devices.%s.customresources: %s has no effect while devices.%s.enabled is false: this chart serves a vendor only when it is enabled; set devices.%s.enabled=true (docs/configuration.md)" $section $name $section $section) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when a vendor section of device-config.yaml turns overwriteEnv on (the webhook then
     also sees pods that ask for no device: scheduler/webhook.yaml) */}}
{{- define "hami.overwriteEnv" -}}
{{- if regexMatch "(?m)^\\s*-?\\s*overwriteEnv:\\s*true\\s*$" (include "hami.deviceConfig" .) }}true{{ end -}}
{{- end -}}
