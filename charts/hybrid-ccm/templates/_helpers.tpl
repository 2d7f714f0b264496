{{- define "hybrid-ccm.labels" -}}
app.kubernetes.io/name: hybrid-ccm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: hybrid-ccm
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The coordinator's namespace, where the native CCMs' ServiceAccounts live:
ccm-coordinator.namespace (its chart's default when unset) or its deprecated
name ccm-coordinator.releaseNamespace, which wins when set (as in that chart),
or the release namespace. */}}
{{- define "hybrid-ccm.coordinatorNamespace" -}}
{{- $c := index .Values "ccm-coordinator" | default dict -}}
{{- default .Release.Namespace ($c.releaseNamespace | default $c.namespace) -}}
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

{{/* Refuses an argument that sets a flag set elsewhere, naming the value's
path, the argument and the rule (a JSON schema "not" could only say "'not'
failed"). dict: path (e.g. "extraArgs"), args, rules (flag name, "*" at the
end for a prefix → who sets it instead). Flag names compare with "_" as "-",
one dash or two, as Go's and Kubernetes' flag parsers take them. */}}
{{- define "hybrid-ccm.refuseEnforced" -}}
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

{{/*
hybrid-ccm.domain: a cloud's domain (clouds.<name>.domain) as JSON, label key
to its values ({} for none), refusing what the fence cannot enforce: an
operator other than In, a key given twice, no values.
*/}}
{{- define "hybrid-ccm.domain" -}}
{{- $out := dict -}}
{{- with .domain -}}
{{- with .splitBy -}}
{{- if not (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" (toString .)) -}}
{{- fail (printf "clouds.%s.domain.splitBy: %v is not a label key" $.name .) -}}
{{- end -}}
{{- end -}}
{{- range $k, $v := (.matchLabels | default dict) -}}
{{- $_ := set $out $k (list (toString $v)) -}}
{{- end -}}
{{- range $i, $e := (.matchExpressions | default list) -}}
{{- if ne (toString $e.operator) "In" -}}
{{- fail (printf "clouds.%s.domain.matchExpressions[%d]: operator %v: a domain may only use In (the fence enforces equality and set membership)" $.name $i $e.operator) -}}
{{- end -}}
{{- if hasKey $out (toString $e.key) -}}
{{- fail (printf "clouds.%s.domain: key %v is given twice: give each label key once" $.name $e.key) -}}
{{- end -}}
{{- if not $e.values -}}
{{- fail (printf "clouds.%s.domain.matchExpressions[%d]: key %v has no values" $.name $i $e.key) -}}
{{- end -}}
{{- $vs := list -}}
{{- range $e.values }}{{ $vs = append $vs (toString .) }}{{ end -}}
{{- $_ := set $out (toString $e.key) ($vs | uniq | sortAlpha) -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}

{{/* The coordinator's ServiceAccount: the ccm-coordinator chart names it
after the release (its ccm-coordinator.name), in the coordinator's
namespace. */}}
{{- define "hybrid-ccm.coordinatorName" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A cloud's takeOver.lease, <namespace>/<name> of the Lease of the CCM it
takes over from, as JSON {namespace, name}; anything else fails naming the
value and the form. dict: name (the cloud), lease. */}}
{{- define "hybrid-ccm.takeOverLease" -}}
{{- $lease := toString .lease -}}
{{- if or (gt (len $lease) 317) (gt (len (regexReplaceAll "^[^/]*/" $lease "")) 253) (not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $lease)) -}}
{{- fail (printf "clouds.%s.takeOver.lease %q: must be <namespace>/<name> of a Lease, e.g. kube-system/cloud-controller-manager (the leader-election Lease of the CCM the NativeCCM %s takes over from)" .name $lease .name) -}}
{{- end -}}
{{- $parts := splitList "/" $lease -}}
{{- dict "namespace" (index $parts 0) "name" (index $parts 1) | toJson -}}
{{- end -}}
