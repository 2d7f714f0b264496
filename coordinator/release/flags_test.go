package release_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
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
			_, err := release.FromProfile(p, release.Instance{ReleaseName: "r", Namespace: "n", Platform: "hcloud", Args: []string{"--v=2", tc.arg}})
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
		l := release.Lifecycle{Release: "r", Namespace: "n", Platform: "p", LeaseName: "r", SecurePort: 10300,
			Args: []string{"--use_service_account_credentials=true"}}
		m, err := release.ParseManifests([]byte(upstreamLike))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Mutate(m); !errors.Is(err, release.ErrEnforcedFlag) || !strings.Contains(err.Error(), "--use-service-account-credentials") {
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
	l := release.Lifecycle{Release: "native-ccm-hcloud", Namespace: "kube-system", Platform: "hcloud", LeaseName: "native-ccm-hcloud", SecurePort: 10300,
		Args: []string{"--node_monitor_period=7s"}}
	c := releasetest.Decode(t, enforce(t, l, upstreamUnderscores)).Deployments[0].Spec.Template.Spec.Containers[0]
	releasetest.AssertFlags(t, append(append([]string{}, c.Command[1:]...), c.Args...), l)
	if c.Ports[0].ContainerPort != 10300 {
		t.Errorf("port %d not moved from -secure_port", c.Ports[0].ContainerPort)
	}
}
