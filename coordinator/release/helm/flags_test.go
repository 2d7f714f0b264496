package helm

import (
	"context"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
)

// TestReleasePathRefusesAndReplaces goes through the real release path (the
// embedded chart rendered by the Helm SDK, then the post-renderer): chart
// values cannot smuggle an enforced flag in another spelling past the chart's
// schema, and the rendered CCM has each enforced flag once.
func TestReleasePathRefusesAndReplaces(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	e := NewEngine(nil, Options{})
	for _, arg := range []string{"--use_service_account_credentials=true", "--leader_elect_resource_name=talos-ccm", "-secure_port=10258", "--cluster-name", "-v"} {
		in := release.Instance{ReleaseName: "native-ccm-hcloud", Namespace: "kube-system", Platform: "hcloud", Values: map[string]any{"args": []any{arg}}}
		if _, err := release.FromProfile(p, in); err == nil || !strings.Contains(err.Error(), "spec.overrides.values.args[0]") {
			t.Errorf("values args %s: err = %v, want FromProfile to refuse it", arg, err)
		}
		// and the chart's schema, should the values get there
		in.Values = nil
		req, err := release.FromProfile(p, in)
		if err != nil {
			t.Fatal(err)
		}
		req.Values["args"] = []any{arg}
		if _, err := e.Render(context.Background(), req); err == nil || !strings.Contains(err.Error(), "args") {
			t.Errorf("values args %s: err = %v, want the chart schema to refuse it", arg, err)
		}
	}
	req, err := release.FromProfile(p, release.Instance{ReleaseName: "native-ccm-hcloud", Namespace: "kube-system", Platform: "hcloud",
		Args: []string{"--node_monitor_period=7s"}, Values: map[string]any{"args": []any{"--node-monitor-period=5s", "--v=2"}}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := e.Render(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	c := releasetest.Decode(t, out).Deployments[0].Spec.Template.Spec.Containers[0]
	releasetest.AssertFlags(t, append(append([]string{}, c.Command...), c.Args...), req.Lifecycle)
}
