{{- define "ccm-coordinator.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The coordinator's own namespace: it runs there, and so do the native CCM
releases (their Helm history, credentials Secrets and leases). */}}
{{- define "ccm-coordinator.releaseNamespace" -}}
{{- default .Release.Namespace .Values.releaseNamespace -}}
{{- end -}}

{{- define "ccm-coordinator.username" -}}
{{- printf "system:serviceaccount:%s:%s" (include "ccm-coordinator.releaseNamespace" .) (include "ccm-coordinator.name" .) -}}
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
