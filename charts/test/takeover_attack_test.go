package charts_test

import (
	"strings"
	"testing"
)

// TestTakeOverValuesAttack: a take-over lease is user input that ends up in
// a NativeCCM, a Role's namespace and resourceNames. Nothing but
// <namespace>/<name> of a Lease gets through, in either chart: no YAML, no
// template, no second line, no wildcard, no empty name.
func TestTakeOverValuesAttack(t *testing.T) {
	for _, lease := range []string{
		"kube-system/ccm\n", "kube-system/ccm\nkind: ClusterRole", `kube-system/c"m`, "kube-system/{{ .Release.Name }}",
		"kube-system/*", "kube-system/", "*/ccm", "kube-system/ccm/x", "kube-system/" + strings.Repeat("a", 300),
		" kube-system/ccm", "kube-system/ccm ", "kube-system/CCM", "kube-system/ccm#x", "kube-system\\ccm",
	} {
		umbrella := map[string]any{"clouds": map[string]any{"aws": map[string]any{"enabled": true, "takeOver": map[string]any{"lease": lease}}}}
		if out, err := render(t, hybridCCM, umbrella); err == nil {
			t.Errorf("clouds.aws.takeOver.lease %q rendered:\n%s", lease, grepTakeOver(out))
		}
		if out, err := render(t, ccmCoordinator, map[string]any{"takeOverLeases": []any{lease}}); err == nil {
			t.Errorf("takeOverLeases [%q] rendered:\n%s", lease, grepTakeOver(out))
		}
	}
}

// TestTakeOverOnlyWhereItBelongs: takeOver is a cloud's value; the schema
// refuses it anywhere else (a value it ignores there would look as if it
// did something).
func TestTakeOverOnlyWhereItBelongs(t *testing.T) {
	for _, v := range []string{
		`grafanaDashboard: {takeOver: {lease: kube-system/cloud-controller-manager}}`,
		`cloudDefaults: {takeOver: {lease: kube-system/cloud-controller-manager}}`,
	} {
		if _, err := render(t, hybridCCM, values(t, v)); err == nil {
			t.Errorf("%s: accepted", v)
		}
	}
}

func grepTakeOver(manifest string) string {
	var out []string
	for _, l := range strings.Split(manifest, "\n") {
		if strings.Contains(l, "take-over") || strings.Contains(l, "lease") || strings.Contains(l, "namespace:") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
