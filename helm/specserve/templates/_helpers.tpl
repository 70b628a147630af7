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
{{- range .Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
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
{{- end }}
