{{/*
(hami-py) kube-scheduler's container and the files it needs to call the extender over https: in
the scheduler's pod (HAMi's layout), or with scheduler.kubeScheduler.separatePod in a Deployment
of its own (kube-scheduler.yaml).
*/}}
{{- define "hami.kubeScheduler.container" -}}
{{- $sched := .Values.scheduler -}}
- name: kube-scheduler
  image: {{ include "hami.kubeSchedulerImage" . }}
  imagePullPolicy: {{ $sched.kubeScheduler.image.pullPolicy }}
  command:
    - kube-scheduler
    - --config=/config/config.yaml
    {{- range $sched.kubeScheduler.extraNewArgs }}
    - {{ . }}
    {{- end }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
  resources:
    {{- toYaml $sched.kubeScheduler.resources | nindent 4 }}
  volumeMounts:
    - name: scheduler-config
      mountPath: /config
      readOnly: true
    {{- if include "hami.extender.mtls" . }}
    - name: extender-tls-ca
      mountPath: /extender-tls
      readOnly: true
    - name: extender-client
      mountPath: /extender-client
      readOnly: true
    {{- end }}
{{- end -}}

{{- define "hami.kubeScheduler.clientVolumes" -}}
- name: extender-client      # kube-scheduler: its client certificate and key
  secret:
    secretName: {{ include "hami.scheduler.extenderClient" . }}
    items: [{key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}]
- name: extender-tls-ca      # kube-scheduler: the CA of the extender's serving certificate
  secret:
    secretName: {{ include "hami.scheduler.tls" . }}
    items: [{key: ca.crt, path: ca.crt}]
{{- end -}}

{{/* The Lease the extender's replicas campaign for when kube-scheduler is not beside them. */}}
{{- define "hami.extender.lease" -}}{{ .Values.schedulerName }}-extender{{- end -}}
