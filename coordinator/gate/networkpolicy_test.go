package gate_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// TestNetworkPolicyMutator: the release gets one NetworkPolicy, its own
// (a chart's are dropped), labelled as the coordinator's; a configuration
// that is not CIDRs and ports is refused naming the value; the
// fingerprint follows the configuration (a change upgrades the release).
func TestNetworkPolicyMutator(t *testing.T) {
	cfg := gate.NetworkPolicyConfig{
		APIServer: gate.Egress{CIDRs: []string{"10.0.0.0/8"}, Ports: []int32{6443}},
		CloudAPI:  gate.Egress{CIDRs: []string{"0.0.0.0/0", "::/0"}, Ports: []int32{443}},
	}
	np := gate.NetworkPolicy{Release: "native-ccm-hcloud", Namespace: "hybrid-ccm-system", Platform: "hcloud", NetworkPolicyConfig: cfg}
	m, err := release.ParseManifests([]byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all, namespace: hybrid-ccm-system}
spec: {podSelector: {}, ingress: [{}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: keep, namespace: hybrid-ccm-system}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := np.Mutate(m); err != nil {
		t.Fatal(err)
	}
	nps := m.Find("NetworkPolicy")
	if len(nps) != 1 || nps[0].GetName() != "native-ccm-hcloud" || len(m.Find("ConfigMap")) != 1 {
		t.Fatalf("after the mutator: %d NetworkPolicies %v, %d ConfigMaps", len(nps), nps, len(m.Find("ConfigMap")))
	}
	if l := nps[0].GetLabels(); l[release.ManagedByLabel] != release.ManagedByValue || l[release.NativeCCMLabel] != "native-ccm-hcloud" {
		t.Errorf("labels %v", l)
	}
	o := np.Object()
	if len(o.Spec.Ingress) != 0 || len(o.Spec.Egress) != 3 || o.Spec.Egress[1].To[0].IPBlock.CIDR != "10.0.0.0/8" || o.Spec.Egress[0].To != nil {
		t.Errorf("spec %+v", o.Spec)
	}

	other := np
	other.CloudAPI = gate.Egress{CIDRs: []string{"203.0.113.0/24"}, Ports: []int32{443}}
	if other.Fingerprint() == np.Fingerprint() {
		t.Error("fingerprint does not follow the CIDRs")
	}

	for _, tc := range []struct {
		name string
		e    gate.Egress
		want string
	}{
		{"no CIDR", gate.Egress{Ports: []int32{443}}, "at least one CIDR and one port"},
		{"no port", gate.Egress{CIDRs: []string{"10.0.0.0/8"}}, "at least one CIDR and one port"},
		{"not a CIDR", gate.Egress{CIDRs: []string{"api.example.com"}, Ports: []int32{443}}, `"api.example.com" is not a CIDR`},
		{"host bits", gate.Egress{CIDRs: []string{"10.0.0.1/8"}, Ports: []int32{443}}, `"10.0.0.1/8" is not a CIDR`},
		{"port 0", gate.Egress{CIDRs: []string{"10.0.0.0/8"}, Ports: []int32{0}}, "port 0 is not 1-65535"},
	} {
		bad := np
		bad.CloudAPI = tc.e
		err := bad.Mutate(m)
		if !errors.Is(err, gate.ErrConfig) || !strings.Contains(err.Error(), "cloud API: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig %q", tc.name, err, tc.want)
		}
	}
}
