{{/*
The default configs of the three parts. Each part's `config:` value is merged over its default
with mustMergeOverwrite, as the OpenTelemetry Collector's chart does: maps merge key by key, a
value given replaces the default's, lists (pipelines' component lists) are replaced whole. The
result goes through `tpl`, so values may use templates.
*/}}

{{- define "otel-ofu.agentDefaultConfig" -}}
{{- /* Each series has one source (docs/fleet.md): the agents serve and send their GPUs' series (and the
reports their node's training jobs send them, and their own self-telemetry) to Prometheus and the OTLP
backend themselves; the jobs tier, directly or through the gateway, gets only what its jobs processor
reads and serves only the job series. */}}
{{- $kubelet := include "otel-ofu.kubeletEnabled" . }}
{{- $exporters := list }}
{{- if .Values.prometheus.enabled }}{{ $exporters = append $exporters "prometheus" }}{{ end }}
{{- $otlpType := include "otel-ofu.otlpExporterType" . }}
{{- if .Values.otlp.endpoint }}{{ $exporters = append $exporters $otlpType }}{{ end }}
{{- if not $exporters }}
{{- fail "the agent has nowhere to send its GPUs' OFU: enable prometheus or set otlp.endpoint" }}
{{- end }}
{{- /* metrics/self goes where the agent's own output goes; the jobs tier reads OFU and reports only. */}}
{{- $selfExporters := $exporters }}
{{- $toJobs := include "otel-ofu.agentsToJobs" . }}
{{- if .Values.gateway.enabled }}{{ $exporters = append $exporters "otlp/gateway" }}
{{- else if $toJobs }}{{ $exporters = append $exporters "otlp/jobs" }}{{ end }}
{{- $receivers := list .Values.source }}
{{- $otlpPorts := include "otel-ofu.agentOtlpPorts" . | fromYamlArray }}
{{- if .Values.agent.otlpReceiver.enabled }}
{{- if not $otlpPorts }}
{{- fail "agent.otlpReceiver.enabled needs grpcPort or httpPort" }}
{{- end }}
{{- $receivers = append $receivers "otlp" }}
{{- end }}
receivers:
  {{- if eq .Values.source "dcgm_exporter" }}
  dcgm_exporter:
    endpoint: {{ include "otel-ofu.dcgmExporterEndpoint" . | quote }}
    collection_interval: {{ .Values.dcgmExporter.collectionInterval }}
    exporter_collect_interval: {{ .Values.dcgmExporter.collectionInterval }}
  {{- else if eq .Values.source "dcgm" }}
  dcgm:
    address: {{ .Values.dcgm.address | quote }}
    collection_interval: {{ .Values.dcgm.collectionInterval }}
  {{- else if eq .Values.source "nvml" }}
  nvml:
    collection_interval: {{ .Values.nvml.collectionInterval }}
    report_processes: {{ .Values.attribution.processes.enabled }}
  {{- else }}
  {{- fail (printf "source must be dcgm_exporter, dcgm or nvml, not %q" .Values.source) }}
  {{- end }}
  {{- if .Values.agent.otlpReceiver.enabled }}
  # What the node's training jobs report about themselves (docs/audit.md), on the pod's IP (through
  # the node-local Service; with agent.otlpReceiver.hostPort, the node's IP). Reports only: anything
  # else sent here is dropped.
  otlp:
    protocols:
      {{- with .Values.agent.otlpReceiver.grpcPort }}
      grpc:
        endpoint: ${env:K8S_POD_IP}:{{ . }}
      {{- end }}
      {{- with .Values.agent.otlpReceiver.httpPort }}
      http:
        endpoint: ${env:K8S_POD_IP}:{{ . }}
      {{- end }}
    {{- if include "otel-ofu.otlpAuth" . }}
    # Authorization: Bearer <token>, the Secret's token (agent.otlpReceiver.auth).
    auth:
      bearer_token_file: /etc/otel-ofu/otlp-token/token
    {{- end }}
    passthrough: false
    decode: [training.mfu, training.tflops_per_gpu, megatron.training.throughput_tflops]
  {{- end }}
  selftelemetry:
    collection_interval: 30s
processors:
  attribution:
    kubelet:
      enabled: {{ if $kubelet }}true{{ else }}false{{ end }}
      socket: /var/lib/kubelet/pod-resources/kubelet.sock
    {{- if .Values.attribution.processes.enabled }}
    processes:
      enabled: true
      proc_root: /proc
      # The nvml receiver reports each GPU's pids on its samples; other sources ask NVML here.
      pid_sources: [{{ if eq .Values.source "nvml" }}samples{{ else }}nvml{{ end }}]
    {{- end }}
    {{- if .Values.attribution.kubernetesApi.enabled }}
    kubernetes_api:
      enabled: true
      node_name: ${env:K8S_NODE_NAME}
      {{- with .Values.attribution.kubernetesApi.copyLabels }}
      copy_labels: {{ toJson . }}
      {{- end }}
      {{- with .Values.attribution.kubernetesApi.ownerLookups }}
      owner_lookups:
        {{- range . }}
        - {{ if .group }}{{ printf "%s.%s" .kind .group }}{{ else }}{{ .kind }}{{ end }}
        {{- end }}
      {{- end }}
    {{- end }}
    dra:
      drivers: {{ if .Values.attribution.dra.enabled }}{{ toJson .Values.attribution.dra.drivers }}{{ else }}[]{{ end }}
      resource_claims: {{ .Values.attribution.dra.resourceClaims }}
    precision_key: {{ .Values.attribution.precisionKey | quote }}
    k8s_job_label: {{ .Values.attribution.jobLabel | quote }}
    # A report is taken only from the pod it names (with kubernetes_api: the pods' addresses).
    report_sender:
      verify: {{ .Values.agent.otlpReceiver.verifySender }}
      {{- with .Values.agent.otlpReceiver.trustedSenders }}
      trusted: {{ toJson . }}
      {{- end }}
    {{- with .Values.attribution.rules }}
    rules:
      {{- toYaml . | nindent 6 }}
    {{- end }}
  ofu:
    tile_correction:
      enabled: {{ .Values.ofu.tileCorrection }}
exporters:
  {{- if .Values.prometheus.enabled }}
  prometheus:
    endpoint: 0.0.0.0:{{ .Values.prometheus.port }}
    metric_expiration: 5m
  {{- end }}
  {{- if .Values.otlp.endpoint }}
  {{ $otlpType }}:
    {{- include "otel-ofu.otlpExporter" (dict "root" . "storage" (ternary "/var/lib/otel-ofu/queue" "" (not (empty .Values.otlp.sendingQueue.hostPath)))) | nindent 4 }}
  {{- end }}
  {{- if .Values.gateway.enabled }}
  # The gateway routes every point of one job to the jobs instance that owns it (docs/fleet.md).
  otlp/gateway:
    endpoint: {{ include "otel-ofu.gatewayEndpoint" . | quote }}
    tls:
      insecure: true
    compression: gzip
    retry_on_failure:
      enabled: true
      max_elapsed_time: 0s
    sending_queue:
      enabled: true
      queue_size: {{ .Values.otlp.sendingQueue.queueSize }}
      num_consumers: 1  # in order: the jobs processor skips a GPU's window at or before its last one
      {{- if .Values.otlp.sendingQueue.hostPath }}
      storage: /var/lib/otel-ofu/queue
      {{- end }}
  {{- else if $toJobs }}
  # The one jobs instance: every agent's GPUs and reports meet there, so a job on many nodes is one job.
  otlp/jobs:
    endpoint: {{ include "otel-ofu.jobsEndpoint" . | quote }}
    tls:
      insecure: true
    {{- if .Values.jobs.authSecretName }}
    headers:
      authorization: Bearer ${env:OFU_JOBS_TOKEN}
    {{- end }}
    compression: gzip
    retry_on_failure:
      enabled: true
      max_elapsed_time: 0s
    sending_queue:
      enabled: true
      queue_size: {{ .Values.otlp.sendingQueue.queueSize }}
      num_consumers: 1  # in order: the jobs processor skips a GPU's window at or before its last one
  {{- end }}
service:
  telemetry:
    logs:
      level: {{ .Values.agent.logLevel }}
  pipelines:
    metrics:
      receivers: {{ toJson $receivers }}
      processors: [attribution, ofu]
      exporters: {{ toJson $exporters }}
    metrics/self:
      receivers: [selftelemetry]
      exporters: {{ toJson $selfExporters }}
{{- end }}

{{- define "otel-ofu.jobsDefaultConfig" -}}
{{- $exporters := list }}
{{- if .Values.prometheus.enabled }}{{ $exporters = append $exporters "prometheus" }}{{ end }}
{{- $otlpType := include "otel-ofu.otlpExporterType" . }}
{{- if .Values.otlp.endpoint }}{{ $exporters = append $exporters $otlpType }}{{ end }}
{{- if not $exporters }}
{{- fail "the jobs tier has nowhere to send: set otlp.endpoint (your backend) or enable prometheus" }}
{{- end }}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 0.0.0.0:4317
    {{- if .Values.jobs.authSecretName }}
    auth:
      bearer_token_file: /etc/otel-ofu/jobs-auth/token
    {{- end }}
    # The agents serve and send their GPUs' metrics themselves: only what the jobs processor reads is
    # taken (the gateway forwards only these), as in collector-config/fleet-jobs.yaml.
    passthrough: false
    decode: {{ include "otel-ofu.jobsInputs" . }}
    # Refuse retryably (the gateway keeps and resends) before the container's memory limit; the
    # per-GPU caches are emptied first (docs/reliability.md).
    memory_limiter:
      limit_percentage: 80
      spike_limit_percentage: 20
  selftelemetry:
    collection_interval: 30s
processors:
  jobs:
    # The agents' collection interval: the window a GPU's first point covers.
    default_interval: {{ if eq .Values.source "dcgm" }}{{ .Values.dcgm.collectionInterval }}{{ else if eq .Values.source "nvml" }}{{ .Values.nvml.collectionInterval }}{{ else }}{{ .Values.dcgmExporter.collectionInterval }}{{ end }}
    {{- if .Values.jobs.persistence.enabled }}
    # Jobs resume after a restart (docs/fleet.md); the volume holds the sending queue too.
    storage: /var/lib/otel-ofu/jobs
    {{- end }}
    # Only the job metrics and events leave: the agents serve the per-GPU ones (no series twice).
    passthrough: false
exporters:
  {{- if .Values.prometheus.enabled }}
  prometheus:
    endpoint: 0.0.0.0:{{ .Values.prometheus.port }}
    metric_expiration: 5m
  {{- end }}
  {{- if .Values.otlp.endpoint }}
  {{ $otlpType }}:
    {{- include "otel-ofu.otlpExporter" (dict "root" . "storage" "/var/lib/otel-ofu/queue") | nindent 4 }}
  {{- end }}
service:
  telemetry:
    logs:
      level: {{ .Values.jobs.logLevel }}
  pipelines:
    metrics:
      receivers: [otlp]
      processors: [jobs]
      exporters: {{ toJson $exporters }}
    metrics/self:
      receivers: [selftelemetry]
      exporters: {{ toJson $exporters }}
{{- end }}

{{- define "otel-ofu.gatewayDefaultConfig" -}}
{{- /* The same pipelines as collector-config/otelcol-gateway.yaml (tests/test_fleet_configs.py), with
the k8s or dns resolver for the jobs tier instead of a static list. */}}
{{- /* One request at a time to each jobs instance: what waited while it restarted arrives in order (the jobs
processor skips a GPU's window at or before its last one as a duplicate). */}}
{{- $protocol := dict "otlp" (dict "timeout" "10s" "tls" (dict "insecure" true) "sending_queue" (dict "num_consumers" 1)) }}
{{- if .Values.jobs.authSecretName }}
{{- $_ := set $protocol.otlp "headers" (dict "authorization" "Bearer ${env:OFU_JOBS_TOKEN}") }}
{{- end }}
{{- $resolver := dict }}
{{- if eq .Values.gateway.resolver "k8s" }}
{{- $resolver = dict "k8s" (dict "service" (printf "%s.%s" (include "otel-ofu.jobsHeadlessName" .) .Release.Namespace) "ports" (list 4317)) }}
{{- else if eq .Values.gateway.resolver "dns" }}
{{- $resolver = dict "dns" (dict "hostname" (printf "%s.%s.svc" (include "otel-ofu.jobsHeadlessName" .) .Release.Namespace) "port" "4317") }}
{{- else }}
{{- fail (printf "gateway.resolver must be k8s or dns, not %q" .Values.gateway.resolver) }}
{{- end }}
extensions:
  health_check:
    endpoint: 0.0.0.0:13133
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 0.0.0.0:4317
      http:
        endpoint: 0.0.0.0:4318
processors:
  memory_limiter:
    check_interval: 1s
    limit_percentage: 80
    spike_limit_percentage: 25
  batch:
    timeout: 1s
  # The jobs tier takes only what its jobs processor reads (the agents serve the GPUs' series), of
  # GPUs and reports that name a job: the rest is dropped here, not carried to it.
  filter/keep_jobs:
    error_mode: ignore
    metrics:
      resource:
        - resource.attributes["ofu.job.id"] == nil or resource.attributes["ofu.job.id"] == "" or resource.attributes["ofu.job.id"] == "none" or resource.attributes["ofu.job.id"] == "unknown"
  filter/jobs_inputs:
    error_mode: ignore
    metrics:
      metric:
        - {{ include "otel-ofu.notJobsInputs" . | quote }}
exporters:
  load_balancing/jobs:
    # The exporter reads ofu.job.id from the resource, scope and data point attributes (contrib v0.161.0).
    routing_key: attributes
    routing_attributes: [ofu.job.id]
    protocol:
      {{- toYaml $protocol | nindent 6 }}
    resolver:
      {{- toYaml $resolver | nindent 6 }}
service:
  extensions: [health_check]
  telemetry:
    metrics:
      level: normal
      readers:
        - pull:
            exporter:
              prometheus:
                host: 0.0.0.0
                port: 8888
  pipelines:
    metrics/jobs:
      receivers: [otlp]
      processors: [memory_limiter, filter/keep_jobs, filter/jobs_inputs, batch]
      exporters: [load_balancing/jobs]
{{- end }}

{{/* What the jobs processor reads: the jobs tier's otlp receiver decodes these, the gateway forwards only
these (collector-config/fleet-jobs.yaml and otelcol-gateway.yaml name the same). */}}
{{- define "otel-ofu.jobsInputs" -}}
[gpu.ofu, gpu.flops.achieved, gpu.ofu.loss, gpu.link.throughput, gpu.job.share, gpu.energy, training.mfu, training.tflops_per_gpu, megatron.training.throughput_tflops]
{{- end }}

{{/* The gateway's filter condition: a metric the jobs tier does not read (dropped). */}}
{{- define "otel-ofu.notJobsInputs" -}}
{{- $names := list }}
{{- range (include "otel-ofu.jobsInputs" . | fromYamlArray) }}{{ $names = append $names (printf "name == %q" .) }}{{ end }}
{{- printf "not (%s)" (join " or " $names) }}
{{- end }}

{{/* A part's final config: its default, then .config over it, then tpl. */}}
{{- define "otel-ofu.mergedConfig" -}}
{{- $default := include .template .root | fromYaml }}
{{- if hasKey $default "Error" }}
{{- fail (printf "%s did not render to YAML: %s" .template (get $default "Error")) }}
{{- end }}
{{- $config := mustMergeOverwrite $default (deepCopy (.config | default dict)) }}
{{- tpl (toYaml $config) .root }}
{{- end }}
