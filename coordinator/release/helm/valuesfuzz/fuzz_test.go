package valuesfuzz

import (
	"context"
	"testing"
	"unicode/utf8"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
)

// FuzzNativeCCMChartValues renders the built-in chart through the
// post-renderer with hostile strings in every value a user can set through
// spec.overrides.values: either the render fails, or every string arrives as
// data (no new keys, containers, volumes or host access) and the pod passes
// the post-renderer's checks.
func FuzzNativeCCMChartValues(f *testing.F) {
	for _, s := range []string{"system-cluster-critical", "a\n  hostPID: true", "x: y", "'\"", "{{ .Release.Name }}", "- --controllers=*", "\x00", "a: [b", "&a *a", "!!binary AA=="} {
		f.Add(s, uint8(0))
	}
	e := helm.NewEngine(nil, helm.Options{})
	set, err := profile.Builtin()
	if err != nil {
		f.Fatal(err)
	}
	hcloud, _ := set.Get("hcloud")
	f.Fuzz(func(t *testing.T, s string, which uint8) {
		if !utf8.ValidString(s) {
			return
		}
		fields := []func(string) map[string]any{
			func(s string) map[string]any { return map[string]any{"priorityClassName": s} },
			func(s string) map[string]any {
				return map[string]any{"cloudConfig": map[string]any{"key": "cloud.conf", "path": s}}
			},
			func(s string) map[string]any {
				return map[string]any{"cloudConfig": map[string]any{"key": "cloud.conf", "path": "/etc/c/cloud.conf", "flag": s}}
			},
			func(s string) map[string]any {
				return map[string]any{"env": []any{map[string]any{"name": "X", "value": s}}}
			},
			func(s string) map[string]any { return map[string]any{"args": []any{s}} },
			func(s string) map[string]any { return map[string]any{"podAnnotations": map[string]any{"a": s}} },
			func(s string) map[string]any { return map[string]any{"nodeSelector": map[string]any{"n": s}} },
			func(s string) map[string]any {
				return map[string]any{"image": map[string]any{"repository": s, "tag": "v1"}}
			},
			func(s string) map[string]any {
				return map[string]any{"credentials": map[string]any{"secretName": s, "env": []any{map[string]any{"name": "T", "key": "k"}}}}
			},
			func(s string) map[string]any { return map[string]any{"bindAddress": s} },
		}
		req, err := release.FromProfile(hcloud, release.Instance{ReleaseName: "native-ccm-hcloud", Namespace: "kube-system", Platform: "hcloud",
			Values: fields[int(which)%len(fields)](s)})
		if err != nil {
			return // refused before rendering (an arg that is not one --name=value, ...): fine
		}
		out, err := e.Render(context.Background(), req)
		if err != nil {
			return // refused: fine, as long as it did not panic
		}
		d := releasetest.Decode(t, out)
		if len(d.Deployments) != 1 {
			t.Fatalf("deployments: %v", d.Kinds)
		}
		spec := d.Deployments[0].Spec.Template.Spec
		if spec.HostPID || spec.HostIPC || spec.HostNetwork || len(spec.InitContainers) != 0 || len(spec.Containers) != 1 || len(spec.Volumes) > 1 {
			t.Fatalf("value %q changed the pod's shape: %+v", s, spec)
		}
		if c := spec.Containers[0]; c.SecurityContext == nil || c.SecurityContext.Privileged != nil || len(c.Ports) != 1 {
			t.Fatalf("value %q changed the container: %+v", s, c)
		}
	})
}
