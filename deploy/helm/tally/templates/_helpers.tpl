{{/* The release's base name: the release name, or release-chart when it does not say tally. */}}
{{- define "tally.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tally.eppName" -}}
{{- printf "%s-epp" (include "tally.fullname" .) -}}
{{- end -}}

{{- define "tally.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tally.labels" -}}
{{ include "tally.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tally.eppSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-epp
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The endpoint picker's gauges under the names `server.metricNames` chooses, as JSON:
{"engine": ..., "waiting": ..., "running": ..., "cacheUse": ...}. tally serves the `vllm` and
`sglang` names only with `--metrics-compat` (the Deployment passes it).
*/}}
{{- define "tally.metricNames" -}}
{{- $names := dict
  "tally" (dict "engine" "tally" "waiting" "tally_requests_waiting" "running" "tally_requests_running" "cacheUse" "tally_prefix_cache_usage")
  "vllm" (dict "engine" "vllm" "waiting" "vllm:num_requests_waiting" "running" "vllm:num_requests_running" "cacheUse" "vllm:kv_cache_usage_perc")
  "sglang" (dict "engine" "sglang" "waiting" "sglang:num_queue_reqs" "running" "sglang:num_running_reqs" "cacheUse" "sglang:token_usage") -}}
{{- $chosen := get $names .Values.server.metricNames -}}
{{- if not $chosen -}}
{{- fail (printf "server.metricNames is %q: it must be tally, vllm or sglang" .Values.server.metricNames) -}}
{{- end -}}
{{- toJson $chosen -}}
{{- end -}}

{{/* `tally serve`'s arguments. */}}
{{- define "tally.args" -}}
{{- $metrics := include "tally.metricNames" . | fromJson -}}
- serve
- --model
- {{ .Values.model.path | quote }}
{{- with .Values.model.servedModelNames }}
- --served-model-name
{{- range . }}
- {{ . | quote }}
{{- end }}
{{- end }}
- --host
- "0.0.0.0"
- --port
- {{ .Values.server.port | quote }}
- --backend
- {{ .Values.server.backend | quote }}
- --dtype
- {{ .Values.server.dtype | quote }}
- --max-queue
- {{ .Values.server.maxQueue | quote }}
- --prefix-cache-mib
- {{ .Values.server.prefixCacheMiB | quote }}
{{- with .Values.server.maxBatchTokens }}
- --max-batch-tokens
- {{ . | quote }}
{{- end }}
- --request-timeout-secs
- {{ .Values.server.requestTimeoutSeconds | quote }}
- --shutdown-timeout-secs
- {{ add .Values.server.requestTimeoutSeconds 5 | quote }}
{{- if ne $metrics.engine "tally" }}
- --metrics-compat
- {{ $metrics.engine | quote }}
{{- end }}
{{- range .Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
