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

{{/* Helm's ownership annotations, which Helm itself sets on what it installs.
In the chart too, so that what "helm template" renders (docs/deploy, Talos'
cluster.externalCloudProvider.manifests) is adopted by a later "helm install"
or Flux HelmRelease of the same release name and namespace (docs/install.md,
"Bootstrap, then Helm or Flux"). */}}
{{- define "talos-ccm.ownership" -}}
meta.helm.sh/release-name: {{ .Release.Name }}
meta.helm.sh/release-namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* Refuses an argument that sets a flag set elsewhere, naming the value's
path, the argument and the rule (a JSON schema "not" could only say "'not'
failed"). dict: path (e.g. "extraArgs"), args, rules (flag name, "*" at the
end for a prefix → who sets it instead). Flag names compare with "_" as "-",
one dash or two, as Go's and Kubernetes' flag parsers take them. */}}
{{- define "talos-ccm.refuseEnforced" -}}
{{- $rules := .rules -}}
{{- range $i, $arg := .args -}}
{{- $name := regexReplaceAll "^--?([^=]*).*$" (toString $arg) "${1}" | replace "_" "-" -}}
{{- range $flag := keys $rules | sortAlpha -}}
{{- if or (eq $name $flag) (and (hasSuffix "*" $flag) (hasPrefix (trimSuffix "*" $flag) $name)) -}}
{{- fail (printf "%s[%d] %q: --%s is not yours to set: %s" $.path $i (toString $arg) $name (get $rules $flag)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The scheduling of the replicas: the user's affinity and spread, or with
standbys (replicas > 1) and neither set, one replica per node preferred and
spread across zones. */}}
{{- define "talos-ccm.spread" -}}
{{- if or .Values.affinity .Values.topologySpreadConstraints }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- else if gt (int .Values.replicas) 1 }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "talos-ccm.selectorLabels" . | nindent 14 }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "talos-ccm.selectorLabels" . | nindent 8 }}
{{- end }}
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
