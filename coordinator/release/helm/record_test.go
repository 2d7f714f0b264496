package helm

import (
	"context"
	"strings"
	"testing"

	helmrelease "helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// TestRecordProblemsReadsHelmsRecords (security round three, hole 2):
// release.RecordProblems reads records as Helm's own Secrets driver writes
// them, without Helm, and finds what a compromised coordinator would put in
// one for an admin's Helm to run: hooks, kinds the native-ccm chart never
// renders (the fence, the coordinator's policy), cluster-wide objects not
// named after the release, objects in other namespaces. An honest record
// has none.
func TestRecordProblemsReadsHelmsRecords(t *testing.T) {
	const ns = "hybrid-ccm-system"
	const honest = `---
# Source: native-ccm/templates/serviceaccount.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: native-ccm-hcloud
  namespace: hybrid-ccm-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: native-ccm-hcloud:auth-delegator
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: native-ccm-hcloud:extension-apiserver-authentication-reader
  namespace: kube-system
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: native-ccm-hcloud
`
	const forged = `---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: hybrid-ccm-fence.hybridccm.io
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: cluster-admin
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
`
	tests := []struct {
		name     string              // case
		manifest string              // the release's manifest
		hooks    []*helmrelease.Hook // its hooks
		want     []string            // parts of the problems, in order; none for an honest record
	}{
		{name: "honest", manifest: honest},
		{name: "forged", manifest: forged,
			hooks: []*helmrelease.Hook{{Name: "own-the-cluster", Kind: "ClusterRoleBinding", Events: []helmrelease.HookEvent{helmrelease.HookPreDelete}}},
			want: []string{`hook ClusterRoleBinding "own-the-cluster"`, "ValidatingAdmissionPolicy /hybrid-ccm-fence.hybridccm.io, a kind",
				"ClusterRoleBinding /cluster-admin, a cluster-wide object", "ConfigMap kube-system/coredns, outside"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			secrets := fake.NewClientset().CoreV1().Secrets(ns)
			d := driver.NewSecrets(secrets)
			rel := &helmrelease.Release{Name: "native-ccm-hcloud", Namespace: ns, Version: 1,
				Info: &helmrelease.Info{Status: helmrelease.StatusDeployed}, Manifest: tt.manifest, Hooks: tt.hooks}
			if err := d.Create("sh.helm.release.v1.native-ccm-hcloud.v1", rel); err != nil {
				t.Fatal(err)
			}
			s, err := secrets.Get(context.Background(), "sh.helm.release.v1.native-ccm-hcloud.v1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got := release.RecordProblems(s)
			if len(got) != len(tt.want) {
				t.Fatalf("problems %q, want %d", got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d %q does not say %q", i, got[i], w)
				}
			}
		})
	}
	// whatever the data, an answer and no panic
	for _, data := range []string{"", "%%%", "H4sIAAAAAAAA", "bnVsbA==", "W10="} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns}, Data: map[string][]byte{"release": []byte(data)}}
		if got := release.RecordProblems(s); len(got) == 0 && data != "bnVsbA==" {
			t.Errorf("%q: no problem", data)
		}
	}
}
