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

{{/* The platforms whose native CCM may run on the host network: those of the
profiles that declare ccm.hostNetwork, the built-in ones (profiles/*.yaml; the
table below is checked against them by charts/test) with profileOverrides
merged over them as the coordinator merges them (maps merge, lists replace).
A JSON list of strings: templates use it as data (policy.yaml as a CEL list
constant, namespace.yaml to choose the Pod Security level), never as text. */}}
{{- define "ccm-coordinator.hostNetworkPlatforms" -}}
{{- $profiles := `{"aws":{"hostNetwork":false,"platforms":["aws"]},"azure":{"hostNetwork":false,"platforms":["azure"]},"cloudscale":{"hostNetwork":false,"platforms":["cloudscale"]},"digital-ocean":{"hostNetwork":false,"platforms":["digital-ocean"]},"gcp":{"hostNetwork":false,"platforms":["gcp"]},"hcloud":{"hostNetwork":false,"platforms":["hcloud"]},"openstack":{"hostNetwork":false,"platforms":["openstack"]},"oracle":{"hostNetwork":false,"platforms":["oracle"]},"scaleway":{"hostNetwork":false,"platforms":["scaleway"]}}` | fromJson }}
{{- range $file, $o := .Values.profileOverrides }}
{{- $base := get $profiles (toString $o.name) | default dict }}
{{- $platforms := hasKey $o "platforms" | ternary $o.platforms $base.platforms }}
{{- $ccm := kindIs "map" $o.ccm | ternary $o.ccm dict }}
{{- $hostNetwork := hasKey $ccm "hostNetwork" | ternary $ccm.hostNetwork $base.hostNetwork }}
{{- $_ := set $profiles (toString $o.name) (dict "platforms" ($platforms | default list) "hostNetwork" (eq (toString $hostNetwork) "true")) }}
{{- end }}
{{- $out := list }}
{{- range $name, $p := $profiles }}
{{- if $p.hostNetwork }}
{{- range $platform := $p.platforms }}
{{- $out = append $out (toString $platform) }}
{{- end }}
{{- end }}
{{- end }}
{{- $out | uniq | sortAlpha | toJson }}
{{- end -}}

{{/* Helm's ownership annotations, which Helm itself sets on what it installs.
In the chart too, so that what "helm template" renders (docs/deploy, Talos'
cluster.externalCloudProvider.manifests) is adopted by a later "helm install"
or Flux HelmRelease of the same release name and namespace (docs/install.md,
"Bootstrap, then Helm or Flux"). */}}
{{- define "ccm-coordinator.ownership" -}}
meta.helm.sh/release-name: {{ .Release.Name }}
meta.helm.sh/release-namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* The scheduling of the replicas: the user's affinity and spread, or with
standbys (replicas > 1) and neither set, one replica per node preferred and
spread across zones. */}}
{{- define "ccm-coordinator.spread" -}}
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
              {{- include "ccm-coordinator.selectorLabels" . | nindent 14 }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "ccm-coordinator.selectorLabels" . | nindent 8 }}
{{- end }}
{{- end -}}

{{/* Names of the image pull Secrets of the pod: global.imagePullSecrets (an
umbrella's, for every chart) then imagePullSecrets, each once; a JSON list. */}}
{{- define "ccm-coordinator.imagePullSecrets" -}}
{{- $names := list -}}
{{- range concat (dig "imagePullSecrets" list (.Values.global | default dict)) (.Values.imagePullSecrets | default list) -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}
