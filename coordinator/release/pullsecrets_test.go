package release_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
)

// withChartPullSecret is upstreamLike's Deployment with an image pull Secret
// of the chart's own (what an upstream chart renders from its values).
var withChartPullSecret = strings.Replace(upstreamLike, "      serviceAccountName: cloud-controller-manager\n",
	"      serviceAccountName: cloud-controller-manager\n      imagePullSecrets: [{name: chart-own}, {name: regcred}]\n", 1)

// TestLifecycleImagePullSecrets: the CCM's pod gets every image pull Secret
// the release names, after those its chart rendered, each once; a release
// without any keeps the pod's as the chart rendered them and its fingerprint
// (no upgrade of existing releases).
func TestLifecycleImagePullSecrets(t *testing.T) {
	base := release.Lifecycle{
		Release: "native-ccm-azure", Namespace: "hybrid-ccm-system", Platform: "azure",
		LeaseName: "native-ccm-azure", SecurePort: 10271, HostNetwork: true,
		Drop: []profile.ObjectMatch{{Kind: "DaemonSet", Name: ".*node-manager"}},
	}
	for _, tc := range []struct {
		// name of the case.
		name string
		// chart is what the chart rendered.
		chart string
		// secrets are Lifecycle.ImagePullSecrets.
		secrets []string
		// want are the pod's imagePullSecrets afterwards.
		want []string
	}{
		{"none", upstreamLike, nil, nil},
		{"added", upstreamLike, []string{"regcred", "mirror"}, []string{"regcred", "mirror"}},
		{"chart's kept, ours after, none twice", withChartPullSecret, []string{"regcred", "mirror"}, []string{"chart-own", "regcred", "mirror"}},
		{"chart's kept without ours", withChartPullSecret, nil, []string{"chart-own", "regcred"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := base
			l.ImagePullSecrets = tc.secrets
			d := releasetest.Decode(t, enforce(t, l, tc.chart))
			var got []string
			for _, r := range d.Deployments[0].Spec.Template.Spec.ImagePullSecrets {
				got = append(got, r.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("imagePullSecrets %v, want %v", got, tc.want)
			}
		})
	}

	// The fingerprint without Secrets is what it was before the field
	// existed; with them it differs (the release is upgraded).
	with := base
	with.ImagePullSecrets = []string{"regcred"}
	if base.Fingerprint() == with.Fingerprint() {
		t.Error("adding an image pull Secret leaves the fingerprint: the release would not be upgraded")
	}
	// Fingerprint hashes the JSON of the settings: without Secrets, the
	// field is not there, so the hash is the one releases were made with.
	if b, err := json.Marshal(base); err != nil || strings.Contains(string(b), "imagePullSecrets") {
		t.Errorf("settings without image pull Secrets encode as %s (%v): every release would be upgraded", b, err)
	}
}

// TestImagePullSecretNames: names that are no Secret names, or repeats, are
// refused where they enter (FromProfile names the field) and by the
// enforcement itself.
func TestImagePullSecretNames(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	for _, tc := range []struct {
		// names given.
		names []string
		// want is in the error; empty: accepted.
		want string
	}{
		{[]string{"regcred", "mirror.example"}, ""},
		{[]string{""}, "spec.imagePullSecrets[0]"},
		{[]string{"RegCred"}, "spec.imagePullSecrets[0]"},
		{[]string{"ok", "a/b"}, "spec.imagePullSecrets[1]"},
		{[]string{"ok", "x\nname: evil"}, "spec.imagePullSecrets[1]"},
		{[]string{"regcred", "regcred"}, "spec.imagePullSecrets[1]: Duplicate value"},
	} {
		req, err := release.FromProfile(p, release.Instance{ReleaseName: "native-ccm-hcloud", Namespace: "n", Platform: "hcloud", ImagePullSecrets: tc.names})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q refused: %v", tc.names, err)
		case tc.want == "" && !slices.Equal(req.Lifecycle.ImagePullSecrets, tc.names):
			t.Errorf("%q: lifecycle has %q", tc.names, req.Lifecycle.ImagePullSecrets)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: err %v, want one saying %q", tc.names, err, tc.want)
		}
		if tc.want == "" {
			continue
		}
		l := release.Lifecycle{Release: "r", Namespace: "n", Platform: "p", LeaseName: "r", SecurePort: 10300, ImagePullSecrets: tc.names}
		m, err := release.ParseManifests([]byte(strings.ReplaceAll(upstreamLike, "kind: DaemonSet", "kind: ConfigMap")))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Mutate(m); err == nil || !strings.Contains(err.Error(), "imagePullSecrets") {
			t.Errorf("%q: Mutate err %v", tc.names, err)
		}
	}
}
