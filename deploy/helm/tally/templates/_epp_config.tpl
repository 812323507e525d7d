{{/*
The endpoint picker's configuration (llm-d-router v0.10's EndpointPickerConfig): scores every
ready tally pod on its requests waiting, its prefix cache's free share and (optionally) whether
the request's prefix key went to it before, and picks the best. It reads tally's gauges under the
names `server.metricNames` chose.
*/}}
{{- define "tally.eppConfig" -}}
{{- $epp := .Values.inferencePool.endpointPicker -}}
{{- $metrics := include "tally.metricNames" . | fromJson -}}
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
# tally's bodies are not OpenAI chat: the picker routes on the pods' state and the prefix key.
- type: passthrough-parser
- type: queue-scorer
- type: kv-cache-utilization-scorer
{{- if $epp.prefixAffinity.enabled }}
- type: session-affinity-scorer
  parameters:
    strategy: session_id
    sessionIdConfig:
      sources:
      - header: {{ $epp.prefixAffinity.header | lower }}
      evictionTtlSeconds: {{ $epp.prefixAffinity.ttlSeconds }}
{{- end }}
- type: max-score-picker
- type: metrics-data-source
  parameters:
    scheme: http
    path: /metrics
- type: core-metrics-extractor
  parameters:
    defaultEngine: {{ $metrics.engine }}
    engineConfigs:
    - name: {{ $metrics.engine }}
      queuedRequestsSpec: {{ $metrics.waiting | quote }}
      runningRequestsSpec: {{ $metrics.running | quote }}
      kvUsageSpec: {{ $metrics.cacheUse | quote }}
      loraSpec: ""
      cacheInfoSpec: ""
requestHandler:
  parsers:
  - pluginRef: passthrough-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: {{ $epp.weights.queue }}
  - pluginRef: kv-cache-utilization-scorer
    weight: {{ $epp.weights.cacheUse }}
  {{- if $epp.prefixAffinity.enabled }}
  - pluginRef: session-affinity-scorer
    weight: {{ $epp.weights.prefixAffinity }}
  {{- end }}
  - pluginRef: max-score-picker
{{- end -}}
