package release_test

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest/ccmflags"
)

// TestArgsCarryTheirValue: a flag of a profile or an override without its
// value in the same argument is refused, naming the field and the fix: the
// CCM's flag parser would take the next argument, an enforced flag such as
// --controllers=cloud-node-lifecycle, as its value (issue 22 item 4). So are
// values in arguments of their own, single-dash flags and "--".
func TestArgsCarryTheirValue(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	for _, tc := range []struct {
		name   string
		in     release.Instance
		want   []string // in the error; none: accepted
		wantNo string   // not in the error
	}{
		{name: "bare string flag", in: release.Instance{Args: []string{"--cluster-name"}},
			want: []string{`spec.overrides.args[0]`, `"--cluster-name"`, "write --cluster-name=value", "--cluster-name=true"}},
		{name: "bare boolean flag", in: release.Instance{Args: []string{"--v=2", "--allow-untagged-cloud"}},
			want: []string{`spec.overrides.args[1]`, "--allow-untagged-cloud=true"}, wantNo: "args[0]"},
		{name: "value in its own argument", in: release.Instance{Args: []string{"--cluster-name", "prod"}},
			want: []string{`spec.overrides.args[0]`, `spec.overrides.args[1]`, "not a flag"}},
		{name: "shorthand", in: release.Instance{Args: []string{"-v", "-v=2"}},
			want: []string{`spec.overrides.args[0]`, `spec.overrides.args[1]`, "--v=value"}},
		{name: "terminator", in: release.Instance{Args: []string{"--"}},
			want: []string{`spec.overrides.args[0]`, "ends the CCM's flags"}},
		{name: "empty name", in: release.Instance{Args: []string{"--=x"}},
			want: []string{`spec.overrides.args[0]`, "must be --name=value"}},
		{name: "values.args of the builtin chart", in: release.Instance{Values: map[string]any{"args": []any{"--v=2", "--cluster-name"}}},
			want: []string{`spec.overrides.values.args[1]`, "write --cluster-name=value"}},
		{name: "values.args not a list", in: release.Instance{Values: map[string]any{"args": "--cluster-name"}},
			want: []string{`spec.overrides.values.args`, "must be a list"}},
		{name: "values.args not strings", in: release.Instance{Values: map[string]any{"args": []any{3}}},
			want: []string{`spec.overrides.values.args[0]`}},
		{name: "--name=value and booleans with =", in: release.Instance{
			Args:   []string{"--cluster-name=", "--cluster-name=--controllers=*", "--allow-untagged-cloud=false"},
			Values: map[string]any{"args": []any{"--v=2"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.ReleaseName, tc.in.Namespace, tc.in.Platform = "native-ccm-hcloud", "kube-system", "hcloud"
			_, err := release.FromProfile(p, tc.in)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want an error naming %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want %q in it", err, w)
				}
			}
			if tc.wantNo != "" && strings.Contains(err.Error(), tc.wantNo) {
				t.Errorf("err = %v names %s", err, tc.wantNo)
			}
		})
	}
	t.Run("profile ccm.args", func(t *testing.T) {
		q, _ := set.Get("hcloud")
		q.CCM.Args = append(q.CCM.Args, "--cluster-name")
		errs := profile.Validate(q)
		if len(errs) != 1 || errs[0].Field != field.NewPath("ccm", "args").Index(len(q.CCM.Args)-1).String() || !strings.Contains(errs[0].Detail, "--cluster-name=value") {
			t.Fatalf("errs = %v", errs)
		}
	})
}

// swallowingChart renders, like an upstream chart given values, a flag
// without a value as its last arg: before the enforced flags were put first
// in the args, the CCM read the first of them as its value and ran with
// --controllers=* (issue 22 item 4).
const swallowingChart = `
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
          command: COMMAND
          args: [--cloud-provider=hcloud, --cluster-name]
`

// TestEnforcedFlagsCannotBeSwallowed: whatever a chart renders before or
// after them, the CCM (its own flag set, k8s.io/cloud-provider/app, parses
// the rendered command and args) runs with every enforced flag's value; a
// command the enforced flags cannot follow safely is refused.
func TestEnforcedFlagsCannotBeSwallowed(t *testing.T) {
	l := release.Lifecycle{Release: "native-ccm-hcloud", Namespace: "kube-system", Platform: "hcloud", LeaseName: "native-ccm-hcloud", SecurePort: 10273,
		Args: []string{"--v=2"}}
	want, err := ccmflags.Parse(t, l.EnforcedArgs())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		command string
		// refused names the command arg; "": rendered
		refused string
	}{
		{command: "[/bin/ccm]"},
		{command: "[/bin/ccm, --v=1]"},
		{command: "[/bin/ccm, --cluster-name, prod]"},
		// stripping the enforced two-token flag leaves --cluster-name last
		{command: "[/bin/ccm, --cluster-name, --controllers, '*']", refused: `command[1] "--cluster-name"`},
		{command: "[/bin/ccm, --cluster-name]", refused: `command[1] "--cluster-name"`},
		{command: "[/bin/ccm, -v]", refused: `command[1] "-v"`},
		{command: "[/bin/ccm, --, x]", refused: `command[1] is "--"`},
	} {
		t.Run(tc.command, func(t *testing.T) {
			m, err := release.ParseManifests([]byte(strings.Replace(swallowingChart, "COMMAND", tc.command, 1)))
			if err != nil {
				t.Fatal(err)
			}
			err = l.Mutate(m)
			if tc.refused != "" {
				if !errors.Is(err, release.ErrSwallowingCommand) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("err = %v, want %v naming %s", err, release.ErrSwallowingCommand, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out, err := m.Encode()
			if err != nil {
				t.Fatal(err)
			}
			c := releasetest.Decode(t, string(out)).Deployments[0].Spec.Template.Spec.Containers[0]
			argv := append(append([]string{}, c.Command[1:]...), c.Args...)
			got, err := ccmflags.Parse(t, argv)
			if err != nil {
				t.Fatalf("the CCM would not start with %q: %v", argv, err)
			}
			for _, a := range l.EnforcedArgs() {
				name := strings.TrimPrefix(profile.FlagName(a), "--")
				if g, w := ccmflags.Value(t, got, name), ccmflags.Value(t, want, name); g != w {
					t.Errorf("the CCM runs with --%s=%s, want %s (argv %q)", name, g, w, argv)
				}
			}
		})
	}
}
