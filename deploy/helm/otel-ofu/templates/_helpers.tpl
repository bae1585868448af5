{{/* Names, labels, images and the agent's security decisions. */}}

{{- define "otel-ofu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "otel-ofu.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's resource name: <fullname>-<component>, within 63 characters. */}}
{{- define "otel-ofu.componentName" -}}
{{- printf "%s-%s" (include "otel-ofu.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component }}
{{- end }}

{{- define "otel-ofu.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "otel-ofu.labels" -}}
helm.sh/chart: {{ include "otel-ofu.chart" .root }}
{{ include "otel-ofu.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: otel-ofu
{{- end }}

{{- define "otel-ofu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "otel-ofu.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "otel-ofu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "otel-ofu.componentName" (dict "root" . "component" "agent")) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag or repository@digest */}}
{{- define "otel-ofu.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (toString (.image.tag | default .default)) }}
{{- end }}
{{- end }}

{{/* The otel-ofu image, as deploy/image.sh names it: [registry/]repository:appVersion[-dcgm]. */}}
{{- define "otel-ofu.image" -}}
{{- $image := deepCopy .Values.image }}
{{- with .Values.image.registry }}
{{- $_ := set $image "repository" (printf "%s/%s" (trimSuffix "/" .) $image.repository) }}
{{- end }}
{{- $tag := .Chart.AppVersion }}
{{- if eq .Values.source "dcgm" }}{{ $tag = printf "%s-dcgm" $tag }}{{ end }}
{{- include "otel-ofu.imageRef" (dict "image" $image "default" $tag) }}
{{- end }}

{{/* "true" when the kubelet pod-resources source is on (attribution.kubelet: auto|true|false). */}}
{{- define "otel-ofu.kubeletEnabled" -}}
{{- $k := toString .Values.attribution.kubelet }}
{{- if eq $k "auto" }}
{{- if ne .Values.source "dcgm_exporter" }}true{{ end }}
{{- else if eq $k "true" }}true
{{- else if ne $k "false" }}
{{- fail (printf "attribution.kubelet must be auto, true or false, not %q" $k) }}
{{- end }}
{{- end }}

{{/* "true" when the agent container uses NVML itself (nvml source, or NVML pids for the processes source). */}}
{{- define "otel-ofu.agentUsesNvml" -}}
{{- if or (eq .Values.source "nvml") .Values.attribution.processes.enabled }}true{{ end }}
{{- end }}

{{/* "true" when the agent must run as uid 0: the root-owned kubelet socket, other processes' /proc, GPM,
the root-owned host directory of an on-disk queue. */}}
{{- define "otel-ofu.agentNeedsRoot" -}}
{{- if or (include "otel-ofu.kubeletEnabled" .) .Values.attribution.processes.enabled (eq .Values.source "nvml") .Values.otlp.sendingQueue.hostPath }}true{{ end }}
{{- end }}

{{/* The agent container's securityContext: agent.securityContext when set, else the least the source needs. */}}
{{- define "otel-ofu.agentSecurityContext" -}}
{{- if .Values.agent.securityContext }}
{{- toYaml .Values.agent.securityContext }}
{{- else }}
{{- $add := list }}
{{- if and (eq .Values.source "nvml") .Values.nvml.profilingCapability }}
{{- $add = append $add "SYS_ADMIN" }}
{{- end }}
{{- if and .Values.attribution.processes.enabled .Values.attribution.processes.ptrace }}
{{- $add = append $add "SYS_PTRACE" }}
{{- end }}
{{- if include "otel-ofu.agentNeedsRoot" . }}
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
{{- else }}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
{{- end }}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  {{- with $add }}
  add: {{ toJson . }}
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end }}

{{/* Non-root, read-only, no capabilities: the jobs tier and the gateway need nothing more. */}}
{{- define "otel-ofu.restrictedSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "otel-ofu.dcgmExporterEndpoint" -}}
{{- if .Values.dcgmExporter.endpoint }}
{{- .Values.dcgmExporter.endpoint }}
{{- else if .Values.dcgmExporter.localService.create }}
{{- printf "http://%s.%s.svc:%v/metrics" (include "otel-ofu.componentName" (dict "root" . "component" "dcgm-exporter")) .Values.dcgmExporter.localService.namespace .Values.dcgmExporter.localService.port }}
{{- else }}
{{- fail "source dcgm_exporter: set dcgmExporter.endpoint, or dcgmExporter.localService.create=true" }}
{{- end }}
{{- end }}

{{- define "otel-ofu.gatewayEndpoint" -}}
{{- printf "%s.%s.svc:4317" (include "otel-ofu.componentName" (dict "root" . "component" "gateway")) .Release.Namespace }}
{{- end }}

{{- define "otel-ofu.jobsHeadlessName" -}}
{{- include "otel-ofu.componentName" (dict "root" . "component" "jobs-headless") }}
{{- end }}

{{/* The jobs instance the agents send to without a gateway (its headless Service: one pod). */}}
{{- define "otel-ofu.jobsEndpoint" -}}
{{- printf "%s.%s.svc:4317" (include "otel-ofu.jobsHeadlessName" .) .Release.Namespace }}
{{- end }}

{{/* "true" when the agents send straight to the one jobs instance (jobs on, no gateway). */}}
{{- define "otel-ofu.agentsToJobs" -}}
{{- if and .Values.agent.enabled .Values.jobs.enabled (not .Values.gateway.enabled) }}
{{- if gt (int .Values.jobs.replicas) 1 }}
{{- fail (printf "jobs.replicas is %d: more than one jobs instance needs gateway.enabled, which sends every point of a job to the same instance (without it a job's GPUs would be split between instances)" (int .Values.jobs.replicas)) }}
{{- end }}true
{{- end }}
{{- end }}

{{/* The agent's OTLP receiver ports that are on: a list of (name, port). */}}
{{- define "otel-ofu.agentOtlpPorts" -}}
{{- $r := .Values.agent.otlpReceiver }}
{{- if $r.enabled }}
{{- if $r.grpcPort }}
- {name: otlp-grpc, port: {{ $r.grpcPort }}}
{{- end }}
{{- if $r.httpPort }}
- {name: otlp-http, port: {{ $r.httpPort }}}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when the agents' OTLP receiver requires a bearer token (agent.otlpReceiver.auth). */}}
{{- define "otel-ofu.otlpAuth" -}}
{{- $r := .Values.agent.otlpReceiver }}
{{- if and .Values.agent.enabled $r.enabled $r.auth.enabled }}
{{- if and $r.auth.existingSecret $r.auth.jobNamespaces }}
{{- fail "agent.otlpReceiver.auth.jobNamespaces copies the token Secret the chart creates; with existingSecret, copy your Secret into the jobs' namespaces yourself (docs/deploy.md, \"Training jobs report their MFU to the agent\")" }}
{{- end }}true
{{- end }}
{{- end }}

{{/* The Secret holding the agents' OTLP token (key "token"): existingSecret, or the chart's. */}}
{{- define "otel-ofu.otlpTokenSecret" -}}
{{- .Values.agent.otlpReceiver.auth.existingSecret | default (include "otel-ofu.componentName" (dict "root" . "component" "otlp-token")) }}
{{- end }}

{{/* The agent's probe, whatever is on: the Prometheus endpoint's /metrics (answers while the exporter's
HTTP server and the process are alive), else a connection to the OTLP receiver; nothing without either
(the agent then listens on no port). */}}
{{- define "otel-ofu.agentProbe" -}}
{{- $otlpPorts := include "otel-ofu.agentOtlpPorts" . | fromYamlArray }}
{{- if .Values.prometheus.enabled }}
httpGet:
  path: /metrics
  port: metrics
{{- else if $otlpPorts }}
tcpSocket:
  port: {{ (first $otlpPorts).name }}
{{- end }}
{{- end }}

{{/* Environment every otel-ofu container gets: its node, pod and namespace from the downward API. */}}
{{- define "otel-ofu.downwardEnv" -}}
- name: K8S_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: K8S_NODE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: K8S_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: K8S_POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
# Python's writable places on a read-only root filesystem: the /tmp emptyDir.
- name: HOME
  value: /tmp
{{- end }}

{{/* Env vars of the OTLP headers kept in Secrets: OFU_HEADER_<n>. */}}
{{- define "otel-ofu.otlpHeaderEnv" -}}
{{- range $i, $h := .Values.otlp.headersFromSecrets }}
- name: {{ printf "OFU_HEADER_%d" $i }}
  valueFrom:
    secretKeyRef:
      name: {{ required "otlp.headersFromSecrets[].secretName is required" $h.secretName }}
      key: {{ required "otlp.headersFromSecrets[].secretKey is required" $h.secretKey }}
{{- end }}
{{- end }}

{{/* The otel-ofu otlp/otlphttp exporter block for .Values.otlp (the backend); dict root, storage. */}}
{{- define "otel-ofu.otlpExporter" -}}
{{- $o := .root.Values.otlp }}
endpoint: {{ $o.endpoint | quote }}
{{- with $o.logsEndpoint }}
{{- if ne $o.protocol "http" }}
{{- fail "otlp.logsEndpoint needs otlp.protocol http (the gRPC exporter sends events to otlp.endpoint)" }}
{{- end }}
logs_endpoint: {{ . | quote }}
{{- end }}
{{- if not $o.events }}
{{- if and $o.logsEndpoint (ne $o.logsEndpoint "none") }}
{{- fail "otlp.events false sends no events: leave otlp.logsEndpoint empty" }}
{{- end }}
events: false
{{- end }}
compression: {{ $o.compression }}
{{- $headers := dict }}
{{- range $k, $v := $o.headers }}
{{- $_ := set $headers $k (toString $v) }}
{{- end }}
{{- range $i, $h := $o.headersFromSecrets }}
{{- $_ := set $headers (required "otlp.headersFromSecrets[].header is required" $h.header) (printf "${env:OFU_HEADER_%d}" $i) }}
{{- end }}
{{- with $headers }}
headers:
  {{- toYaml . | nindent 2 }}
{{- end }}
tls:
  {{- if $o.tls.insecure }}
  insecure: true
  {{- else }}
  insecure: false
  {{- if $o.tls.secretName }}
  ca_file: /etc/otel-ofu/otlp-tls/{{ $o.tls.caKey }}
  {{- if $o.tls.certKey }}
  cert_file: /etc/otel-ofu/otlp-tls/{{ $o.tls.certKey }}
  key_file: /etc/otel-ofu/otlp-tls/{{ required "otlp.tls.keyKey goes with otlp.tls.certKey" $o.tls.keyKey }}
  {{- end }}
  {{- end }}
  {{- end }}
retry_on_failure:
  enabled: true
  max_elapsed_time: 0s
sending_queue:
  enabled: true
  queue_size: {{ $o.sendingQueue.queueSize }}
  num_consumers: 1  # in order: a backlog drains oldest first (a backend refuses a series' older point after a newer one)
  {{- with .storage }}
  storage: {{ . }}
  {{- end }}
{{- end }}

{{- define "otel-ofu.otlpExporterType" -}}
{{- if eq .Values.otlp.protocol "http" }}otlphttp{{ else if eq .Values.otlp.protocol "grpc" }}otlp{{ else }}{{ fail (printf "otlp.protocol must be grpc or http, not %q" .Values.otlp.protocol) }}{{ end }}
{{- end }}

{{/* Volume and mount of the OTLP TLS Secret, when there is one. */}}
{{- define "otel-ofu.otlpTlsVolume" -}}
{{- if and (not .Values.otlp.tls.insecure) .Values.otlp.tls.secretName }}
- name: otlp-tls
  secret:
    secretName: {{ .Values.otlp.tls.secretName }}
{{- end }}
{{- end }}

{{- define "otel-ofu.otlpTlsMount" -}}
{{- if and (not .Values.otlp.tls.insecure) .Values.otlp.tls.secretName }}
- name: otlp-tls
  mountPath: /etc/otel-ofu/otlp-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* 80 % of a memory quantity in Mi or Gi, as a Go GOMEMLIMIT ("409MiB" for "512Mi"). */}}
{{- define "otel-ofu.gomemlimit" -}}
{{- $mem := toString . }}
{{- $mib := 0 }}
{{- if regexMatch "^[0-9]+Gi$" $mem }}
{{- $mib = mul (trimSuffix "Gi" $mem | int) 1024 }}
{{- else if regexMatch "^[0-9]+Mi$" $mem }}
{{- $mib = trimSuffix "Mi" $mem | int }}
{{- else }}
{{- fail (printf "gateway.resources.limits.memory: give it in Mi or Gi (e.g. 512Mi), not %q" $mem) }}
{{- end }}
{{- printf "%dMiB" (div (mul $mib 8) 10) }}
{{- end }}
