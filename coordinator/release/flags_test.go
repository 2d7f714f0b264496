package release

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// TestEnforcedFlagsInEverySpelling: the CCM's flag parser (pflag with
// component-base's word-separator normalization) reads "_" as "-", one or two
// dashes, "--flag=value" and "--flag value", and the last occurrence wins.
// An override of an enforced flag in any of these spellings is refused, and
// chart-rendered ones are replaced.
func TestEnforcedFlagsInEverySpelling(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	overrides := []struct {
		// arg is the override.
		arg string
		// want names the flag in the error.
		want string
	}{
		{arg: "--use_service_account_credentials=true", want: "--use-service-account-credentials (given as --use_service_account_credentials)"},
		{arg: "--leader_elect_resource_name=talos-ccm", want: "--leader-elect-resource-name"},
		{arg: "--secure_port=10258", want: "--secure-port"},
		{arg: "-controllers=*", want: "--controllers"},
		{arg: "--leader-elect", want: "--leader-elect"},
		{arg: "--leader_elect=false", want: "--leader-elect"},
		{arg: "--kube_config=/x", want: ""}, // not a flag the CCM has: not enforced
		{arg: "--kubeconfig=/x", want: "--kubeconfig"},
		{arg: "--bind_address=0.0.0.0", want: "--bind-address"},
	}
	for _, tc := range overrides {
		t.Run("override "+tc.arg, func(t *testing.T) {
			_, err := FromProfile(p, Instance{ReleaseName: "r", Namespace: "n", Platform: "hcloud", Args: []string{"--v=2", tc.arg}})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "spec.overrides.args[1]") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming spec.overrides.args[1] and %s", err, tc.want)
			}
		})
	}
	t.Run("profile args", func(t *testing.T) {
		errs := profile.ValidateArgs(nil, []string{"--use_service_account_credentials=true"})
		if len(errs) != 1 || !strings.Contains(errs.ToAggregate().Error(), "--use-service-account-credentials") {
			t.Fatalf("errs = %v", errs)
		}
	})
	t.Run("the post-renderer refuses enforced args it is given", func(t *testing.T) {
		l := Lifecycle{Release: "r", Namespace: "n", Platform: "p", LeaseName: "r", SecurePort: 10300,
			Args: []string{"--use_service_account_credentials=true"}}
		m, err := parseManifests([]byte(upstreamLike))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Mutate(m); !errors.Is(err, ErrEnforcedFlag) || !strings.Contains(err.Error(), "--use-service-account-credentials") {
			t.Fatalf("err = %v", err)
		}
	})
}

// upstreamUnderscores is an upstream-shaped workload whose flags use every
// spelling the CCM's parser accepts.
const upstreamUnderscores = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: ccm, namespace: kube-system}
spec:
  selector: {matchLabels: {app: ccm}}
  template:
    metadata: {labels: {app: ccm}}
    spec:
      containers:
        - name: ccm
          image: upstream/ccm:1
          command: [/bin/ccm, -controllers, "*", --use_service_account_credentials]
          args: [--leader_elect_resource_name, talos-ccm, -secure_port=10258, --node-monitor-period, 5s, --leader_elect=false, --v=2]
          ports: [{containerPort: 10258, name: https}]
`

// TestChartRenderedEnforcedFlagsAreReplaced: enforced flags a chart renders in
// any spelling (with their values) are replaced, and a profile arg replaces the
// chart's flag of the same name however either is spelled.
func TestChartRenderedEnforcedFlagsAreReplaced(t *testing.T) {
	l := Lifecycle{Release: "native-ccm-hcloud", Namespace: "kube-system", Platform: "hcloud", LeaseName: "native-ccm-hcloud", SecurePort: 10300,
		Args: []string{"--node_monitor_period=7s"}}
	m, err := parseManifests([]byte(upstreamUnderscores))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Mutate(m); err != nil {
		t.Fatal(err)
	}
	out, err := m.encode()
	if err != nil {
		t.Fatal(err)
	}
	c := decode(t, out.String()).deployments[0].Spec.Template.Spec.Containers[0]
	assertFlags(t, append(append([]string{}, c.Command[1:]...), c.Args...), l)
	if c.Ports[0].ContainerPort != 10300 {
		t.Errorf("port %d not moved from -secure_port", c.Ports[0].ContainerPort)
	}
}

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
	for _, arg := range []string{"--use_service_account_credentials=true", "--leader_elect_resource_name=talos-ccm", "-secure_port=10258"} {
		req, err := FromProfile(p, Instance{ReleaseName: "native-ccm-hcloud", Namespace: "kube-system", Platform: "hcloud",
			Values: map[string]any{"args": []any{arg}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Render(context.Background(), req); err == nil || !strings.Contains(err.Error(), "args") {
			t.Errorf("values args %s: err = %v, want the chart schema to refuse it", arg, err)
		}
	}
	req, err := FromProfile(p, Instance{ReleaseName: "native-ccm-hcloud", Namespace: "kube-system", Platform: "hcloud",
		Args: []string{"--node_monitor_period=7s"}, Values: map[string]any{"args": []any{"--node-monitor-period=5s", "--v=2"}}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := e.Render(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	c := decode(t, out).deployments[0].Spec.Template.Spec.Containers[0]
	assertFlags(t, append(append([]string{}, c.Command...), c.Args...), req.Lifecycle)
}

// assertFlags: every enforced flag exactly once with its enforced value, no
// value of a removed two-token flag left, --node-monitor-period only as the
// profile sets it.
func assertFlags(t *testing.T, all []string, l Lifecycle) {
	t.Helper()
	for _, want := range l.enforcedArgs() {
		name := profile.FlagName(want)
		var seen []string
		for _, a := range all {
			if profile.FlagName(a) == name {
				seen = append(seen, a)
			}
		}
		if len(seen) != 1 || seen[0] != want {
			t.Errorf("%s: rendered %v, want exactly %s", name, seen, want)
		}
	}
	var monitor []string
	for _, a := range all {
		switch a {
		case "talos-ccm", "*", "true", "5s":
			t.Errorf("a value of a replaced flag is left: %q in %v", a, all)
		}
		if profile.FlagName(a) == "--node-monitor-period" {
			monitor = append(monitor, a)
		}
	}
	if strings.Join(monitor, " ") != "--node_monitor_period=7s" {
		t.Errorf("--node-monitor-period: %v, want only the profile's", monitor)
	}
}
