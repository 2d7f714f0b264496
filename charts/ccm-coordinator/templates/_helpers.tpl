{{- define "ccm-coordinator.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ccm-coordinator.releaseNamespace" -}}
{{- default .Release.Namespace .Values.releaseNamespace -}}
{{- end -}}

{{- define "ccm-coordinator.selectorLabels" -}}
app.kubernetes.io/name: ccm-coordinator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ccm-coordinator.labels" -}}
{{ include "ccm-coordinator.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
