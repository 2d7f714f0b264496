package charts_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
)

// pullSecretNames are the names of a pod's image pull Secrets, in order.
func pullSecretNames(spec corev1.PodSpec) []string {
	var out []string
	for _, r := range spec.ImagePullSecrets {
		out = append(out, r.Name)
	}
	return out
}

// TestImagePullSecrets: every chart gives its pod the image pull Secrets of
// its values, an umbrella's global ones first, each once; the coordinator
// is told its own (--image-pull-secrets) for the native CCM pods it renders,
// and the umbrella's per-cloud ones become the NativeCCM's
// spec.imagePullSecrets.
func TestImagePullSecrets(t *testing.T) {
	for _, tc := range []struct {
		// name of the case.
		name string
		// chart rendered.
		chart chart
		// values given.
		values string
		// deployments are the Deployments to look at → their pods' Secrets.
		deployments map[string][]string
		// flag is the coordinator's --image-pull-secrets ("": none).
		flag string
	}{
		{"talos-ccm", talosCCM, `imagePullSecrets: [{name: regcred}, {name: mirror}]`,
			map[string][]string{"talos-ccm": {"regcred", "mirror"}}, ""},
		{"talos-ccm with a global", talosCCM, `{global: {imagePullSecrets: [{name: regcred}]}, imagePullSecrets: [{name: mirror}, {name: regcred}]}`,
			map[string][]string{"talos-ccm": {"regcred", "mirror"}}, ""},
		{"ccm-coordinator", ccmCoordinator, `imagePullSecrets: [{name: regcred}]`,
			map[string][]string{"ccm-coordinator": {"regcred"}}, "regcred"},
		{"ccm-coordinator without", ccmCoordinator, ``,
			map[string][]string{"ccm-coordinator": nil}, ""},
		{"native-ccm", nativeCCM, `{platform: hcloud, cloudProvider: hcloud, image: {repository: example.com/hcloud-ccm, tag: v1}, imagePullSecrets: [{name: regcred}]}`,
			map[string][]string{"native-ccm": {"regcred"}}, ""},
		{"umbrella global", hybridCCM, `global: {imagePullSecrets: [{name: regcred}]}`,
			map[string][]string{"talos-ccm": {"regcred"}, "hybrid-ccm": {"regcred"}}, "regcred"},
		{"umbrella global and the subcharts' own", hybridCCM, `{global: {imagePullSecrets: [{name: regcred}]}, talos-ccm: {imagePullSecrets: [{name: talos-only}]}, ccm-coordinator: {imagePullSecrets: [{name: coordinator-only}]}}`,
			map[string][]string{"talos-ccm": {"regcred", "talos-only"}, "hybrid-ccm": {"regcred", "coordinator-only"}}, "regcred,coordinator-only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mustRender(t, tc.chart, values(t, tc.values))
			for name, want := range tc.deployments {
				var d appsv1.Deployment
				m.one(t, "Deployment", name, &d)
				if got := pullSecretNames(d.Spec.Template.Spec); !slices.Equal(got, want) {
					t.Errorf("Deployment %s: pod imagePullSecrets %v, want %v", name, got, want)
				}
				if name != "ccm-coordinator" && name != "hybrid-ccm" {
					continue
				}
				var flags []string
				for _, a := range d.Spec.Template.Spec.Containers[0].Args {
					if v, ok := strings.CutPrefix(a, "--image-pull-secrets="); ok {
						flags = append(flags, v)
					}
				}
				switch {
				case tc.flag == "" && len(flags) > 0:
					t.Errorf("coordinator told --image-pull-secrets=%v without any", flags)
				case tc.flag != "" && !slices.Equal(flags, []string{tc.flag}):
					t.Errorf("coordinator --image-pull-secrets=%v, want once %s", flags, tc.flag)
				}
			}
		})
	}

	// Per cloud: the NativeCCM's spec.imagePullSecrets, as the API type reads them.
	ccms := nativeCCMs(t, mustRender(t, hybridCCM, values(t, `
clouds:
  hcloud: {enabled: true, imagePullSecrets: [{name: mirror}, {name: regcred}]}
  aws: {enabled: true}
`)))
	if got := ccms["hcloud"].Spec.ImagePullSecrets; !slices.Equal(got, []v1.SecretReference{{Name: "mirror"}, {Name: "regcred"}}) {
		t.Errorf("NativeCCM hcloud spec.imagePullSecrets %v", got)
	}
	if got := ccms["aws"].Spec.ImagePullSecrets; got != nil {
		t.Errorf("NativeCCM aws spec.imagePullSecrets %v, want none", got)
	}
}

// TestImagePullSecretsSchema: image pull Secrets of any other shape than a
// pod spec's are refused by every chart's schema, naming where.
func TestImagePullSecretsSchema(t *testing.T) {
	native := `{platform: hcloud, cloudProvider: hcloud, image: {repository: example.com/ccm, tag: v1}, `
	for _, c := range []chart{talosCCM, ccmCoordinator, nativeCCM, hybridCCM} {
		for _, tc := range []struct {
			// name of the case.
			name string
			// value of imagePullSecrets (or of the field the case names).
			value string
			// where the value goes: "" imagePullSecrets, "global" global.imagePullSecrets,
			// "cloud" clouds.hcloud.imagePullSecrets (umbrella only).
			where string
		}{
			{"a name alone", `[regcred]`, ""},
			{"a map", `{name: regcred}`, ""},
			{"no name", `[{secret: regcred}]`, ""},
			{"another field", `[{name: regcred, namespace: other}]`, ""},
			{"not a Secret name", `[{name: Reg/Cred}]`, ""},
			{"an empty name", `[{name: ""}]`, ""},
			{"twice", `[{name: regcred}, {name: regcred}]`, ""},
			{"global a name alone", `[regcred]`, "global"},
			{"global not a Secret name", `[{name: "regcred\nfoo: bar"}]`, "global"},
			{"cloud a name alone", `[regcred]`, "cloud"},
			{"cloud another field", `[{name: regcred, key: x}]`, "cloud"},
		} {
			if c == hybridCCM && tc.where == "" || c != hybridCCM && tc.where == "cloud" {
				continue
			}
			t.Run(string(c)+"/"+tc.name, func(t *testing.T) {
				var vals, path string
				switch tc.where {
				case "":
					vals, path = `{imagePullSecrets: `+tc.value+`}`, "/imagePullSecrets"
				case "global":
					vals, path = `{global: {imagePullSecrets: `+tc.value+`}}`, "/global/imagePullSecrets"
				case "cloud":
					vals, path = `{clouds: {hcloud: {enabled: true, imagePullSecrets: `+tc.value+`}}}`, "/clouds/hcloud/imagePullSecrets"
				}
				if c == nativeCCM {
					vals = native + strings.TrimPrefix(vals, "{")
				}
				_, err := render(t, c, values(t, vals))
				if err == nil || !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), path) {
					t.Errorf("values %s: err %v, want a schema refusal at %s", vals, err, path)
				}
			})
		}
	}
}

// TestImagePullSecretsServerSideDryRun: what the umbrella renders with image
// pull Secrets everywhere is accepted by a real API server: the pods', and
// the NativeCCM's through the CRD's schema.
func TestImagePullSecretsServerSideDryRun(t *testing.T) {
	a := newApplier(t, controlPlane(t))
	m := mustRender(t, hybridCCM, values(t, `
global: {imagePullSecrets: [{name: regcred}]}
clouds:
  hcloud: {enabled: true, imagePullSecrets: [{name: mirror.example}, {name: regcred}]}
`))
	createNamespaces(t, a, m)
	applied := 0
	for _, obj := range m {
		out, err := a.Apply(context.Background(), obj, true)
		if err != nil {
			t.Errorf("API server rejects %s %s: %v", obj.GetKind(), obj.GetName(), err)
			continue
		}
		if out.GetKind() == v1.NativeCCMKind || out.GetKind() == "Deployment" {
			applied++
		}
	}
	if applied != 3 {
		t.Errorf("%d Deployments and NativeCCMs applied, want 3", applied)
	}
}
