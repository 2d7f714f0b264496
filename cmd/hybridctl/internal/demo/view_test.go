package demo

import (
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
)

// TestCSRRows: the table shows each kubelet's newest CSR with the count of
// those before it, and the forged CSR on a line of its own, wherever it
// sorts.
func TestCSRRows(t *testing.T) {
	csr := func(name, node string) certificatesv1.CertificateSigningRequest {
		return certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: certificatesv1.CertificateSigningRequestSpec{Username: "system:node:" + node}}
	}
	s := &state{csrs: []certificatesv1.CertificateSigningRequest{
		csr("csr-a1", terminatedAWS), csr(forgedCSR, terminatedAWS), csr("csr-a2", terminatedAWS),
		csr("csr-b1", stoppedAWS), csr("csr-c1", "cp-metal1"), csr("csr-c2", "cp-metal1"), csr("csr-c3", "cp-metal1"),
	}}
	var got []string
	var earlier []int
	for _, r := range csrRows(s) {
		got = append(got, r.csr.Name)
		earlier = append(earlier, r.earlier)
	}
	want := []string{"csr-a2", forgedCSR, "csr-b1", "csr-c3"}
	if len(got) != len(want) {
		t.Fatalf("rows %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] || earlier[i] != []int{1, 0, 0, 2}[i] {
			t.Errorf("rows %v (earlier %v), want %v (earlier [1 0 0 2])", got, earlier, want)
			break
		}
	}
	if s.forgedDenied() {
		t.Error("an undecided forged CSR counts as denied")
	}
}

// TestDomainText: the table names what each NativeCCM owns.
func TestDomainText(t *testing.T) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"topology.kubernetes.io/region": "us-east-1"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "node.cloudprovider.kubernetes.io/domain", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}
	for _, tc := range []struct {
		spec v1alpha1.NativeCCMSpec
		want string
	}{
		{v1alpha1.NativeCCMSpec{Platform: "hcloud"}, "hcloud (all its nodes)"},
		{v1alpha1.NativeCCMSpec{Platform: "aws", Domain: &v1alpha1.Domain{Selector: sel}},
			"aws, topology.kubernetes.io/region=us-east-1, node.cloudprovider.kubernetes.io/domain in (a,b)"},
	} {
		if got := domainText(&v1alpha1.NativeCCM{Spec: tc.spec}); got != tc.want {
			t.Errorf("domainText(%+v) = %q, want %q", tc.spec, got, tc.want)
		}
	}
}
