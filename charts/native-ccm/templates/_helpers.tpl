{{/* Name of everything this release creates: the release name. */}}
{{- define "native-ccm.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "native-ccm.serviceAccountName" -}}
{{- default (include "native-ccm.name" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "native-ccm.leaseName" -}}
{{- default (include "native-ccm.name" .) .Values.leaderElection.resourceName -}}
{{- end -}}

{{- define "native-ccm.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.resourceNamespace -}}
{{- end -}}

{{- define "native-ccm.selectorLabels" -}}
app.kubernetes.io/name: native-ccm
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "native-ccm.labels" -}}
{{ include "native-ccm.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.platform }}
hybridccm.io/platform: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Image reference; both parts are required once a platform is set. */}}
{{- define "native-ccm.image" -}}
{{- if not (and .Values.image.repository .Values.image.tag) -}}
{{- fail (printf "native-ccm: platform %q is set but image.repository (%q) and image.tag (%q) are not both set (the coordinator takes them from the platform's profile)" .Values.platform .Values.image.repository .Values.image.tag) -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/* Refuses an argument that sets a flag set elsewhere, naming the value's
path, the argument and the rule (a JSON schema "not" could only say "'not'
failed"). dict: path (e.g. "extraArgs"), args, rules (flag name, "*" at the
end for a prefix → who sets it instead). Flag names compare with "_" as "-",
one dash or two, as Go's and Kubernetes' flag parsers take them. */}}
{{- define "native-ccm.refuseEnforced" -}}
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

{{/* Names of the image pull Secrets of the pod: global.imagePullSecrets (an
umbrella's, for every chart) then imagePullSecrets, each once; a JSON list. */}}
{{- define "native-ccm.imagePullSecrets" -}}
{{- $names := list -}}
{{- range concat (dig "imagePullSecrets" list (.Values.global | default dict)) (.Values.imagePullSecrets | default list) -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* The cloud-config file the chart writes itself (cloudConfig.file): the
base file as it is, then one section per setting of cloudConfig.file.set,
which the CCM's INI reader (gcfg) takes over the base's values. Each section
follows a blank line: gcfg continues a line that ends in an unquoted "\"
onto the next, so a base file ending in one would otherwise swallow the
section header. Empty when cloudConfig.file.set is empty: the credentials
Secret's file is mounted. */}}
{{- define "native-ccm.cloudConfigFile" -}}
{{- with .Values.cloudConfig.file }}
{{- if .set }}
{{- .base }}
{{- range .set }}
{{ printf "\n[%s]\n%s = \"%s\"" .section .name .value }}
{{- end }}
{{ end }}
{{- end }}
{{- end -}}

{{- define "native-ccm.cloudConfigSecret" -}}
{{- printf "%s-cloud-config" (include "native-ccm.name" .) | trunc 253 -}}
{{- end -}}
