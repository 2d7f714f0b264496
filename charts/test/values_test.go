package charts_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// install is `helm install --dry-run` of a chart: its objects and the notes
// Helm prints (the umbrella's own, as Helm shows them without
// --render-subchart-notes).
func install(t *testing.T, c chart, vals map[string]any) (manifests, string) {
	t.Helper()
	rel, err := dryInstall(t, c, vals)
	if err != nil {
		t.Fatalf("install %s: %v", c, err)
	}
	m, err := parse(rel.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	return m, rel.Info.Notes
}

// coordinatorNamespaces are the namespaces of the objects the coordinator
// runs with: its Deployment, and the namespace of every ServiceAccount a
// binding of the release names (the umbrella's fence grants too).
func coordinatorNamespaces(t *testing.T, m manifests) map[string]bool {
	t.Helper()
	out := map[string]bool{deploymentOf(t, m).Namespace: true}
	for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
		for _, b := range m.find(kind) {
			subjects, _ := b.Object["subjects"].([]any)
			for _, s := range subjects {
				if s := s.(map[string]any); s["kind"] == "ServiceAccount" && s["namespace"] != releaseNamespace {
					out[s["namespace"].(string)] = true
				}
			}
		}
	}
	return out
}

// TestRemovedAndRenamedValues: the ccm-coordinator chart's namespace value
// (once releaseNamespace) places the coordinator, in the chart and through
// the umbrella; the old key still works, wins when both are set, and the
// notes say it is deprecated; builtinProfiles, which never did anything, is
// accepted for old values files, changes nothing, and the notes say so.
func TestRemovedAndRenamedValues(t *testing.T) {
	const deprecated = "releaseNamespace is deprecated: rename it to"
	for _, tc := range []struct {
		name   string
		c      chart
		vals   string
		ns     string
		notes  []string // in the notes
		silent bool     // no WARNING in the notes
	}{
		{"default", ccmCoordinator, `{}`, "hybrid-ccm-system", []string{"run in hybrid-ccm-system"}, true},
		{"namespace", ccmCoordinator, `{namespace: cloud-a}`, "cloud-a", []string{"run in cloud-a"}, true},
		{"releaseNamespace", ccmCoordinator, `{releaseNamespace: cloud-b}`, "cloud-b",
			[]string{"run in cloud-b", "the value " + deprecated + "\nnamespace"}, false},
		{"both", ccmCoordinator, `{namespace: cloud-a, releaseNamespace: cloud-b}`, "cloud-b",
			[]string{deprecated, `"cloud-b" is used, not namespace "cloud-a"`}, false},
		{"builtinProfiles", ccmCoordinator, `{builtinProfiles: [aws]}`, "hybrid-ccm-system",
			[]string{"the value builtinProfiles is ignored", "profileOverrides"}, false},
		{"umbrella default", hybridCCM, `{clouds: {hcloud: {enabled: true}}}`, "hybrid-ccm-system", nil, true},
		{"umbrella namespace", hybridCCM, `{clouds: {hcloud: {enabled: true}}, ccm-coordinator: {namespace: cloud-a}}`, "cloud-a", nil, true},
		{"umbrella releaseNamespace", hybridCCM, `{clouds: {hcloud: {enabled: true}}, ccm-coordinator: {releaseNamespace: cloud-b}}`, "cloud-b",
			[]string{"the value ccm-coordinator." + deprecated + "\nccm-coordinator.namespace"}, false},
		{"umbrella builtinProfiles", hybridCCM, `{ccm-coordinator: {builtinProfiles: [aws]}}`, "hybrid-ccm-system",
			[]string{"ccm-coordinator.builtinProfiles is ignored", "ccm-coordinator.profileOverrides"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, notes := install(t, tc.c, values(t, tc.vals))
			if tc.c == hybridCCM {
				// the umbrella's Deployments: the coordinator's is the one outside kube-system
				var coord manifests
				for _, d := range m.find("Deployment") {
					if d.GetLabels()["app.kubernetes.io/name"] == "ccm-coordinator" {
						coord = append(coord, d)
					}
				}
				m = append(coord, m.find("ClusterRoleBinding")...)
				m = append(m, m.find("RoleBinding")...)
			}
			got := coordinatorNamespaces(t, m)
			if len(got) != 1 || !got[tc.ns] {
				t.Errorf("the coordinator and the ServiceAccounts bound for it are in %v, want %s only", got, tc.ns)
			}
			for _, want := range tc.notes {
				if !strings.Contains(notes, want) {
					t.Errorf("notes lack %q:\n%s", want, notes)
				}
			}
			if tc.silent && strings.Contains(notes, "WARNING") {
				t.Errorf("notes warn:\n%s", notes)
			}
		})
	}

	// builtinProfiles changes nothing that is rendered
	without, _ := install(t, ccmCoordinator, values(t, `{}`))
	with, _ := install(t, ccmCoordinator, values(t, `{builtinProfiles: [hcloud]}`))
	if a, b := strings.Join(without.names(), ","), strings.Join(with.names(), ","); a != b {
		t.Errorf("builtinProfiles changes the objects: %s, with it %s", a, b)
	}
	if _, err := render(t, ccmCoordinator, values(t, `{namespace: kube-system}`)); err == nil || !strings.Contains(err.Error(), `namespace "kube-system"`) {
		t.Errorf("namespace kube-system: %v, want the refusal naming it", err)
	}
}

// TestSupportedKubernetesRange: one supported range for the product: every
// chart's kubeVersion is ">=1.<M>.0-0" where M is the oldest Kubernetes minor
// a built-in profile has an upstream CCM release for, an API server one
// minor older is refused, and docs/install.md states that range.
func TestSupportedKubernetesRange(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	oldest := -1
	for _, name := range set.Names() {
		p, _ := set.Get(name)
		for k := range p.CCM.Image.Tags {
			if m, err := profile.ParseMinor(k); err == nil && (oldest < 0 || m < oldest) {
				oldest = m
			}
		}
	}
	if oldest < 0 {
		t.Fatal("no built-in profile has a release per minor")
	}
	want := fmt.Sprintf(">=1.%d.0-0", oldest)
	for _, c := range allCharts {
		ch, err := loader.Load(c.path(t))
		if err != nil {
			t.Fatal(err)
		}
		if ch.Metadata.KubeVersion != want {
			t.Errorf("charts/%s kubeVersion %q, want %q (the profiles' oldest minor)", c, ch.Metadata.KubeVersion, want)
		}
		in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
		in.ReleaseName, in.Namespace = c.releaseName(), releaseNamespace
		in.DryRun, in.ClientOnly, in.Replace = true, true, true
		in.KubeVersion = &chartutil.KubeVersion{Version: fmt.Sprintf("v1.%d.9", oldest-1), Major: "1", Minor: fmt.Sprint(oldest - 1)}
		vals := map[string]any{}
		if c == nativeCCM {
			vals["platform"] = "hcloud"
		}
		if _, err := in.Run(ch, vals); err == nil || !strings.Contains(err.Error(), "kubeVersion") {
			t.Errorf("charts/%s on Kubernetes 1.%d: %v, want a refusal naming kubeVersion", c, oldest-1, err)
		}
	}
	doc, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	if stated := fmt.Sprintf("**Kubernetes 1.%d or later** is the supported range", oldest); !strings.Contains(string(doc), stated) ||
		!strings.Contains(string(doc), fmt.Sprintf("kubeVersion: %q", want)) {
		t.Errorf("docs/install.md does not state %q with the charts' kubeVersion %s", stated, want)
	}
}
