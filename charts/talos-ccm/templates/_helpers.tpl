{{/* Name of every object of the release. */}}
{{- define "talos-ccm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "talos-ccm" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-talos-ccm" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The talos.dev ServiceAccount, and the Secret Talos creates for it. */}}
{{- define "talos-ccm.talosSecretName" -}}
{{- if .Values.talos.existingSecret -}}
{{- .Values.talos.existingSecret -}}
{{- else -}}
{{- printf "%s-talos" (include "talos-ccm.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "talos-ccm.selectorLabels" -}}
app.kubernetes.io/name: talos-ccm
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "talos-ccm.labels" -}}
{{ include "talos-ccm.selectorLabels" . }}
app.kubernetes.io/component: cloud-controller-manager
app.kubernetes.io/part-of: hybrid-ccm
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* true when the named controller is selected. */}}
{{- define "talos-ccm.runs" -}}
{{- if has .name .root.Values.controllers -}}true{{- end -}}
{{- end -}}

{{/* The transformations file (--cloud-config), in the format of docs/transformations.md. */}}
{{- define "talos-ccm.cloudConfig" -}}
{{- $t := .Values.transformations -}}
{{- $global := dict "preferIPv6" $t.preferIPv6 "enforce" $t.enforce -}}
{{- with $t.clusterName }}{{ $_ := set $global "clusterName" . }}{{ end -}}
{{- toYaml (dict "global" $global "transformations" ($t.rules | default list)) -}}
{{- end -}}

{{/* Names of the image pull Secrets of the pod: global.imagePullSecrets (an
umbrella's, for every chart) then imagePullSecrets, each once; a JSON list. */}}
{{- define "talos-ccm.imagePullSecrets" -}}
{{- $names := list -}}
{{- range concat (dig "imagePullSecrets" list (.Values.global | default dict)) (.Values.imagePullSecrets | default list) -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}
