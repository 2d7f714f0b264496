package charts_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// hostNetworkPlatforms are the platforms whose profile in set declares
// ccm.hostNetwork: what the coordinator's admission policy lets run on the
// host network.
func hostNetworkPlatforms(set *profile.Set) []string {
	out := []string{}
	for _, name := range set.Names() {
		p, _ := set.Get(name)
		if p.CCM.HostNetwork {
			out = append(out, p.Platforms...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestCoordinatorPolicyHostNetworkIsTheProfiles: the platforms the
// coordinator's admission policy lets run on the host network are those
// whose profile declares ccm.hostNetwork in the profile set the coordinator
// runs with (the built-in profiles with the chart's profileOverrides merged
// by the coordinator's own loader), rendered as data: a CEL list constant
// that is the JSON list of them, whatever the names. The namespace's Pod
// Security level follows: restricted, or privileged when some profile needs
// the host network.
func TestCoordinatorPolicyHostNetworkIsTheProfiles(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		values map[string]any
	}{
		{"defaults", values(t, "{}")},
		{"multi-cloud", ccmCoordinator.ciValues(t, "multi-cloud")},
		{"a new profile that declares it", values(t, `
profileOverrides:
  metal.yaml:
    apiVersion: hybridccm.io/v1alpha1
    kind: Profile
    name: metal
    platforms: [metal, metal-b]
    providerIDPrefixes: ["metal://"]
    ccm: {image: {repository: example.com/metal-ccm, tag: v1}, cloudProvider: metal, securePort: 10292, hostNetwork: true}
    credentials: {none: true}
    chart: {source: builtin}
`)},
		{"an override that takes it back", values(t, `
profileOverrides:
  a.yaml: {name: aws, ccm: {hostNetwork: true}}
  b.yaml: {name: aws, platforms: [aws, ec2]}
  c.yaml: {name: gcp, ccm: {hostNetwork: false}}
`)},
	}
	// every built-in profile, declaring it with an override: the chart knows
	// each one's platforms
	for _, name := range set.Names() {
		cases = append(cases, struct {
			name   string
			values map[string]any
		}{"built-in " + name, values(t, fmt.Sprintf("profileOverrides: {x.yaml: {name: %s, ccm: {hostNetwork: true}}}", name))})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := mustRender(t, ccmCoordinator, tc.values)
			want := hostNetworkPlatforms(coordinatorProfiles(t, m))
			if strings.HasPrefix(tc.name, "built-in ") || tc.name == "a new profile that declares it" {
				if len(want) == 0 {
					t.Fatal("no profile declares ccm.hostNetwork: the case tests nothing")
				}
			}
			var policy admissionregistrationv1.ValidatingAdmissionPolicy
			m.one(t, "ValidatingAdmissionPolicy", "ccm-coordinator.hybridccm.io", &policy)
			i := slices.IndexFunc(policy.Spec.Variables, func(v admissionregistrationv1.Variable) bool { return v.Name == "hostNetworkPlatforms" })
			if i < 0 {
				t.Fatal("the policy has no variable hostNetworkPlatforms")
			}
			var got []string
			if err := json.Unmarshal([]byte(policy.Spec.Variables[i].Expression), &got); err != nil {
				t.Fatalf("hostNetworkPlatforms %q is not a JSON list of strings: %v", policy.Spec.Variables[i].Expression, err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("the policy lets %v run on the host network, the coordinator's profiles declare it for %v", got, want)
			}
			level := "restricted"
			if len(want) > 0 {
				level = "privileged"
			}
			for _, ns := range m.find("v1 Namespace") {
				if l := ns.GetLabels()["pod-security.kubernetes.io/enforce"]; l != level {
					t.Errorf("namespace %s enforces Pod Security %q, want %q", ns.GetName(), l, level)
				}
			}
		})
	}
	// a platform name is data, never CEL or YAML
	for _, bad := range []string{`x', 'y`, `x"]+["y`, "x\n    - name: evil"} {
		v := map[string]any{"profileOverrides": map[string]any{"p.yaml": map[string]any{"name": "p", "platforms": []any{bad}, "ccm": map[string]any{"hostNetwork": true}}}}
		out, err := render(t, ccmCoordinator, v)
		if err != nil {
			t.Logf("platform %q refused: %v", bad, err)
			continue // refused by the schema: fine
		}
		m, err := parse(out)
		if err != nil {
			t.Fatalf("platform %q breaks the rendering: %v", bad, err)
		}
		var policy admissionregistrationv1.ValidatingAdmissionPolicy
		m.one(t, "ValidatingAdmissionPolicy", "ccm-coordinator.hybridccm.io", &policy)
		i := slices.IndexFunc(policy.Spec.Variables, func(v admissionregistrationv1.Variable) bool { return v.Name == "hostNetworkPlatforms" })
		var got []string
		if err := json.Unmarshal([]byte(policy.Spec.Variables[i].Expression), &got); err != nil || !slices.Equal(got, []string{bad}) {
			t.Errorf("platform %q rendered as %q (%v)", bad, policy.Spec.Variables[i].Expression, err)
		}
		var ns corev1.Namespace
		m.one(t, "v1 Namespace", "hybrid-ccm-system", &ns)
		if len(ns.Labels) != 10 {
			t.Errorf("platform %q changed the namespace's labels: %v", bad, ns.Labels)
		}
	}
}
