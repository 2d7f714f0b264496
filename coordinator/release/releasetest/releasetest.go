// Package releasetest holds fixtures and assertions shared by the tests of the
// release description, the Helm engine and the coordinator. Only tests import it.
package releasetest

// UpstreamRBACTemplate is the RBAC a typical upstream CCM chart ships, as a
// Helm template: a ServiceAccount named cloud-controller-manager bound to
// cluster-admin. The lifecycle post-renderer must drop both. It ends with a
// document separator, ready for the chart's workload to follow.
const UpstreamRBACTemplate = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: cloud-controller-manager
  namespace: {{ .Release.Namespace }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .Release.Name }}-cluster-admin
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: cloud-controller-manager, namespace: {{ .Release.Namespace }}}]
---
`

// UpstreamCCMTemplate is a whole upstream-shaped CCM chart template:
// UpstreamRBACTemplate and a Deployment <release>-upstream under that
// ServiceAccount, image .Values.image, the hcloud token from the Secret
// .Values.secretName. annotations are lines added to the Deployment's metadata
// (indented 4 spaces), flags the container's command/args lines (indented 10).
func UpstreamCCMTemplate(annotations, flags string) string {
	meta := ""
	if annotations != "" {
		meta = "  annotations:\n" + annotations
	}
	return UpstreamRBACTemplate + `apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-upstream
  namespace: {{ .Release.Namespace }}
` + meta + `spec:
  selector: {matchLabels: {app: upstream-ccm}}
  template:
    metadata: {labels: {app: upstream-ccm}}
    spec:
      serviceAccountName: cloud-controller-manager
      containers:
        - name: ccm
          image: {{ .Values.image }}
` + flags + `          env:
            - name: HCLOUD_TOKEN
              valueFrom: {secretKeyRef: {name: {{ .Values.secretName }}, key: token}}
          ports: [{containerPort: 10258, name: https}]
`
}
