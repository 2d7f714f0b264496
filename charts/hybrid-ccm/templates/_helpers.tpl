{{- define "hybrid-ccm.labels" -}}
app.kubernetes.io/name: hybrid-ccm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: hybrid-ccm
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The coordinator's namespace, where the native CCMs' ServiceAccounts live:
ccm-coordinator.releaseNamespace (its chart's default when unset), or the
release namespace. */}}
{{- define "hybrid-ccm.coordinatorNamespace" -}}
{{- $c := index .Values "ccm-coordinator" | default dict -}}
{{- default .Release.Namespace $c.releaseNamespace -}}
{{- end -}}
