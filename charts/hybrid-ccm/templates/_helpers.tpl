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

{{/* Helm's ownership annotations, which Helm itself sets on what it installs.
In the chart too, so that what "helm template" renders (docs/deploy, Talos'
cluster.externalCloudProvider.manifests) is adopted by a later "helm install"
or Flux HelmRelease of the same release name and namespace (docs/install.md,
"Bootstrap, then Helm or Flux"). */}}
{{- define "hybrid-ccm.ownership" -}}
meta.helm.sh/release-name: {{ .Release.Name }}
meta.helm.sh/release-namespace: {{ .Release.Namespace }}
{{- end -}}
