{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "specserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart, unless the release name already contains the chart name. */}}
{{- define "specserve.fullname" -}}
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

{{- define "specserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the server pods (Service, PDB, ServiceMonitor through the Service). */}}
{{- define "specserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "specserve.labels" -}}
helm.sh/chart: {{ include "specserve.chart" . }}
{{ include "specserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: specserve
{{- end }}

{{- define "specserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "specserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "specserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The Secret holding the API key: the user's own, or the one this chart creates. */}}
{{- define "specserve.apiKeySecretName" -}}
{{- if .Values.apiKey.existingSecret }}
{{- .Values.apiKey.existingSecret }}
{{- else }}
{{- printf "%s-api-key" (include "specserve.fullname" .) }}
{{- end }}
{{- end }}

{{- define "specserve.claimName" -}}
{{- if .Values.modelCache.existingClaim }}
{{- .Values.modelCache.existingClaim }}
{{- else }}
{{- printf "%s-models" (include "specserve.fullname" .) }}
{{- end }}
{{- end }}

{{/* `specserve serve` arguments after the image's `--host 0.0.0.0 --port 8000`. */}}
{{- define "specserve.args" -}}
{{- $m := .Values.model -}}
- --port
- {{ .Values.server.port | quote }}
- --model
- {{ $m.target | quote }}
{{- if $m.draft }}
- --draft-model
- {{ $m.draft | quote }}
- --num-speculative-tokens
- {{ $m.numSpeculativeTokens | quote }}
- --rejection-sample-method
- {{ $m.rejectionSampleMethod }}
- --draft-sample-method
- {{ $m.draftSampleMethod }}
{{- end }}
{{- if $m.servedModelName }}
- --served-model-name
- {{ $m.servedModelName | quote }}
{{- end }}
{{- if $m.maxModelLen }}
- --max-model-len
- {{ $m.maxModelLen | quote }}
{{- end }}
- --gpu-memory-utilization
- {{ $m.gpuMemoryUtilization | quote }}
- --dtype
- {{ $m.dtype }}
- --max-num-seqs
- {{ $m.maxNumSeqs | quote }}
- --shutdown-timeout
- {{ .Values.server.shutdownTimeout | quote }}
- --log-level
- {{ .Values.server.logLevel }}
{{- if ne .Values.metrics.prefix "specserve" }}
- --metrics-prefix
- {{ .Values.metrics.prefix }}
{{- end }}
{{- range .Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Labels of the helm test pod: the release's, without app.kubernetes.io/name, so that no selector
     of the chart (Service, PDB, InferencePool) counts the test pod as a server. */}}
{{- define "specserve.testLabels" -}}
helm.sh/chart: {{ include "specserve.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: specserve
app.kubernetes.io/component: test
{{- end }}

{{/* The model name clients send: --served-model-name, else the target path (as the server reports it). */}}
{{- define "specserve.servedModelName" -}}
{{- .Values.model.servedModelName | default .Values.model.target }}
{{- end }}

{{/* A metric's exported name under metrics.prefix, e.g. specserve:num_requests_waiting. */}}
{{- define "specserve.metric" -}}
{{- printf "%s:%s" .root.Values.metrics.prefix .name }}
{{- end }}

{{/* Seconds the startup probe allows for weight loading. */}}
{{- define "specserve.startupBudget" -}}
{{- mul .Values.probes.startup.periodSeconds .Values.probes.startup.failureThreshold }}
{{- end }}

{{/* progressDeadlineSeconds: the value set, or the startup budget plus 10 minutes (scheduling, image pull). */}}
{{- define "specserve.progressDeadline" -}}
{{- if .Values.progressDeadlineSeconds }}
{{- .Values.progressDeadlineSeconds }}
{{- else }}
{{- add (include "specserve.startupBudget" . | int) 600 }}
{{- end }}
{{- end }}

{{- define "specserve.inferencePoolName" -}}
{{- .Values.inferencePool.name | default (include "specserve.fullname" .) }}
{{- end }}

{{/* Rules across several values, which values.schema.json cannot state with a clear message. */}}
{{- define "specserve.validate" -}}
{{- if and .Values.apiKey.enabled (not .Values.apiKey.value) (not .Values.apiKey.existingSecret) }}
{{- fail "apiKey.enabled=true needs apiKey.existingSecret (a Secret you manage) or apiKey.value" }}
{{- end }}
{{- if and .Values.apiKey.value .Values.apiKey.existingSecret }}
{{- fail "set apiKey.value or apiKey.existingSecret, not both" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%v) exceeds autoscaling.maxReplicas (%v)" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) }}
{{- end }}
{{- if and .Values.autoscaling.enabled .Values.keda.enabled }}
{{- fail "enable autoscaling (an HPA) or keda (a ScaledObject, which makes its own HPA), not both" }}
{{- end }}
{{- if and .Values.keda.enabled (gt (int .Values.keda.minReplicas) (int .Values.keda.maxReplicas)) }}
{{- fail (printf "keda.minReplicas (%v) exceeds keda.maxReplicas (%v)" .Values.keda.minReplicas .Values.keda.maxReplicas) }}
{{- end }}
{{- $budget := include "specserve.startupBudget" . | int }}
{{- if and .Values.progressDeadlineSeconds (le (int .Values.progressDeadlineSeconds) $budget) }}
{{- fail (printf "progressDeadlineSeconds (%v) must exceed the startup probe's budget of %v s (periodSeconds * failureThreshold), or a slow weight load is reported as a failed rollout" .Values.progressDeadlineSeconds $budget) }}
{{- end }}
{{- if .Values.inferencePool.enabled }}
{{- if not .Values.inferencePool.endpointPicker.serviceName }}
{{- fail "inferencePool.enabled=true needs inferencePool.endpointPicker.serviceName (the endpoint picker's Service)" }}
{{- end }}
{{- if ne .Values.metrics.prefix "vllm" }}
{{- fail "inferencePool.enabled=true needs metrics.prefix=vllm: the endpoint picker reads vLLM's metric names (vllm:num_requests_waiting, vllm:kv_cache_usage_perc)" }}
{{- end }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.enabled=true needs at least one entry in ingress.hosts" }}
{{- end }}
{{- end }}
