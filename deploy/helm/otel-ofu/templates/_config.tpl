{{/*
The default configs of the three parts. Each part's `config:` value is merged over its default
with mustMergeOverwrite, as the OpenTelemetry Collector's chart does: maps merge key by key, a
value given replaces the default's, lists (pipelines' component lists) are replaced whole. The
result goes through `tpl`, so values may use templates.
*/}}

{{- define "otel-ofu.agentDefaultConfig" -}}
{{- $kubelet := include "otel-ofu.kubeletEnabled" . }}
{{- $exporters := list }}
{{- if .Values.prometheus.enabled }}{{ $exporters = append $exporters "prometheus" }}{{ end }}
{{- $otlpType := include "otel-ofu.otlpExporterType" . }}
{{- if .Values.gateway.enabled }}{{ $exporters = append $exporters "otlp/gateway" }}
{{- else if .Values.otlp.endpoint }}{{ $exporters = append $exporters $otlpType }}{{ end }}
{{- if not $exporters }}
{{- fail "the agent has nowhere to send OFU: enable prometheus, set otlp.endpoint, or enable the gateway" }}
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
    precision_key: {{ .Values.attribution.precisionKey | quote }}
    k8s_job_label: {{ .Values.attribution.jobLabel | quote }}
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
  {{- if .Values.gateway.enabled }}
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
      {{- if .Values.otlp.sendingQueue.hostPath }}
      storage: /var/lib/otel-ofu/queue
      {{- end }}
  {{- else if .Values.otlp.endpoint }}
  {{ $otlpType }}:
    {{- include "otel-ofu.otlpExporter" (dict "root" . "storage" (ternary "/var/lib/otel-ofu/queue" "" (not (empty .Values.otlp.sendingQueue.hostPath)))) | nindent 4 }}
  {{- end }}
service:
  telemetry:
    logs:
      level: {{ .Values.agent.logLevel }}
  pipelines:
    metrics:
      receivers: [{{ .Values.source }}]
      processors: [attribution, ofu]
      exporters: {{ toJson $exporters }}
    metrics/self:
      receivers: [selftelemetry]
      exporters: {{ toJson $exporters }}
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
    passthrough: true
  selftelemetry:
    collection_interval: 30s
processors:
  jobs: {}
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
exporters:
  load_balancing:
    # Every point of one job goes to the same jobs-tier instance. The exporter reads the key from
    # resource, scope and data point attributes; points without a job share the key "ofu.job.id=|".
    routing_key: attributes
    routing_attributes: [ofu.job.id]
    protocol:
      otlp:
        timeout: 10s
        {{- if .Values.jobs.authSecretName }}
        headers:
          authorization: Bearer ${env:OFU_JOBS_TOKEN}
        {{- end }}
        tls:
          insecure: true
    resolver:
      {{- if eq .Values.gateway.resolver "k8s" }}
      k8s:
        service: {{ include "otel-ofu.jobsHeadlessName" . }}.{{ .Release.Namespace }}
        ports: [4317]
      {{- else if eq .Values.gateway.resolver "dns" }}
      dns:
        hostname: {{ include "otel-ofu.jobsHeadlessName" . }}.{{ .Release.Namespace }}.svc
        port: "4317"
      {{- else }}
      {{- fail (printf "gateway.resolver must be k8s or dns, not %q" .Values.gateway.resolver) }}
      {{- end }}
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
    metrics:
      receivers: [otlp]
      processors: [memory_limiter, batch]
      exporters: [load_balancing]
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
