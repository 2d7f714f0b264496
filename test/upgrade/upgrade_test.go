package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v3/pkg/chart"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleethelm"
	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// previous is the commit the previous release is built from: main as it
// last landed with CI green (2026-11-28: ownership domains, Kubernetes 1.37,
// the gate proxy in five packages), the release a cluster runs today. Move it
// forward to the last release's commit when releases are tagged.
//
// With the same go.mod as this tree, `make release` of it compiles only the
// product's own packages: every dependency comes from the build cache the
// run's other builds filled. One of an older go.mod (Kubernetes 1.34) compiled
// the whole dependency graph a second time: 1,173 s of test/upgrade cold,
// against 491 s from 2216ba7 (measured 2026-11-29).
const previous = "2216ba79e7ae34e539479ec84d09ac94edc4f8d5"

const (
	// talosNamespace is where the umbrella release and talos-ccm live.
	talosNamespace = "kube-system"
	// ccmNamespace is the coordinator's own (the chart's default).
	ccmNamespace = "hybrid-ccm-system"
	release      = "hybrid-ccm"
)

// nativeCCMs are the NativeCCMs of testdata/values.yaml.
var nativeCCMs = []string{"aws", "hcloud"}

// TestUpgradeWhileNodesJoin installs the previous release as docs/install.md
// says, then runs `helm upgrade` to this tree's release while three machines
// join (an aws instance, an hcloud server, a metal machine), and applies the
// NativeCCM CRD of the new chart as the docs say. Through all of it, from
// before the upgrade to the end, it watches the cluster: no Node deleted and
// none re-tainted or re-labelled to another platform, no CSR denied, every
// leader-election Lease handed over only after its holder released it or let
// it expire (so never two leaders), one Lease per native CCM. At the end
// every Deployment of the product runs the new release, every node is
// initialized with its serving certificate issued, every NativeCCM is Ready
// with a leader of the new release, and no cloud was asked about a machine
// not its own.
func TestUpgradeWhileNodesJoin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	root := testenv.RepoRoot()
	prevRoot := checkout(t, ctx, root, previous)
	prevVersion, curVersion := versions(t, prevRoot, root)
	t.Logf("previous release %s (commit %.12s), current %s", prevVersion, previous, curVersion)
	if err := f.ReleaseFrom(ctx, prevRoot, prevVersion); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx, curVersion); err != nil {
		t.Fatal(err)
	}
	clouds, err := f.StartClouds(fleet.CloudOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = clouds.Close() })

	// The previous release, installed as documented.
	values := installValues(t, clouds.TestCCMURL())
	if err := fleethelm.Install(ctx, f, talosNamespace, release, f.ChartRef("hybrid-ccm"), prevVersion, values); err != nil {
		t.Fatal(err)
	}
	if err := fleetcheck.CredentialsSecrets(ctx, f, clouds, ccmNamespace, false); err != nil {
		t.Fatal(err)
	}
	if err := f.AnswerTalosServiceAccount(ctx, talosNamespace, "talos-ccm-talos"); err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		fleetcheck.WaitNode(t, ctx, f, m, "initialized and Ready", func(n *corev1.Node) bool { return fleetcheck.Initialized(n) && fleetcheck.Ready(n) })
	}
	for _, name := range nativeCCMs {
		chartstest.WaitNativeCCMRunning(t, ctx, f.Config, name)
	}
	t.Logf("previous release %s running: %d nodes initialized, NativeCCMs %v Ready", prevVersion, len(machines), nativeCCMs)

	// From here to the end, the watch.
	w := fleetcheck.StartWatch(t, ctx, f, nativeCCMs)

	// Machines join while the upgrade runs.
	joined := fleetcheck.Join(ctx, f, joining)
	start := time.Now()
	ch, err := fleethelm.Upgrade(ctx, f, talosNamespace, release, f.ChartRef("hybrid-ccm"), curVersion, values)
	if err != nil {
		t.Fatal(err)
	}
	// Helm never updates crds/: apply the new chart's, as docs/install.md says.
	if err := applyCRDs(ctx, ch.Dependencies()); err != nil {
		t.Fatal(err)
	}
	if err := <-joined; err != nil {
		t.Fatal(err)
	}

	// Every Deployment of the product rolled out to the new release: talos-ccm
	// and the coordinator by the upgrade, each native CCM by the new
	// coordinator (its gate sidecar's image is of the new release).
	for _, ns := range []string{talosNamespace, ccmNamespace} {
		deployments, err := f.Client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range deployments.Items {
			if ns == talosNamespace && d.Labels["app.kubernetes.io/instance"] != release {
				continue // the cluster's own (none today)
			}
			fleetcheck.WaitRolledOut(t, ctx, f, ns, d.Name, curVersion)
		}
	}
	for _, name := range nativeCCMs {
		fleetcheck.WaitRolledOut(t, ctx, f, ccmNamespace, "native-ccm-"+name, curVersion)
	}
	t.Logf("upgrade rolled out in %s", time.Since(start).Round(time.Second))

	all := append(slices.Clone(machines), joining...)
	for _, m := range all {
		n := fleetcheck.WaitNode(t, ctx, f, m, "initialized and Ready", func(n *corev1.Node) bool { return fleetcheck.Initialized(n) && fleetcheck.Ready(n) })
		if n.Labels[names.PlatformLabel] != m.Platform || (m.ProviderID != "" && n.Spec.ProviderID != m.ProviderID) {
			t.Errorf("node %s: platform %q providerID %q, want %q %q", m.Name, n.Labels[names.PlatformLabel], n.Spec.ProviderID, m.Platform, m.ProviderID)
		}
	}
	for _, m := range joining {
		fleetcheck.WaitServingCSR(t, ctx, f, m.Name)
	}
	// Each native CCM is led by a pod of the new release: the old leader's
	// lease is released or expires (one lease duration, 100 s), then a new
	// pod takes it and the coordinator reports it.
	for _, name := range nativeCCMs {
		o := waitNativeCCMLeader(t, ctx, name, curVersion)
		// The new coordinator installs its embedded chart at the release's
		// version, not at the one its Chart.yaml had when it was built.
		if want := "native-ccm@" + curVersion; o.Status.Release == nil || o.Status.Release.Chart != want {
			t.Errorf("NativeCCM %s: release %+v, want chart %s", name, o.Status.Release, want)
		}
	}

	// What `hybridctl version` tells the user: every component at the new
	// release.
	components := hybridctlVersion(t, ctx)
	if len(components) != 2+len(nativeCCMs) {
		t.Errorf("hybridctl version shows %d components, want talos-ccm, ccm-coordinator and %d native CCMs: %+v", len(components), len(nativeCCMs), components)
	}
	for _, c := range components {
		if len(c.Versions) == 0 || slices.ContainsFunc(c.Versions, func(v string) bool { return v != curVersion }) {
			t.Errorf("hybridctl version: %s/%s (%s) at %v, want %s", c.Namespace, c.Name, c.Component, c.Versions, curVersion)
		}
	}

	w.Stop()
	for _, e := range w.Errors() {
		t.Error(e)
	}
	for lease, holders := range w.Holders() {
		t.Logf("lease %s: holders %v", lease, holders)
	}
	for _, q := range clouds.Questions() {
		if q.Foreign {
			t.Errorf("the %s cloud was asked about %s, a machine of another platform (%d times)", q.Provider, q.About, q.Times)
		}
	}
}

// waitNativeCCMLeader waits until the NativeCCM is Ready with a leader pod
// whose gate runs version, and returns it.
func waitNativeCCMLeader(t *testing.T, ctx context.Context, name, version string) *v1alpha1.NativeCCM {
	t.Helper()
	var last *v1alpha1.NativeCCM
	var img string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		last = chartstest.NativeCCM(t, ctx, f.Config, name)
		if !apimeta.IsStatusConditionTrue(last.Status.Conditions, "Ready") || last.Status.Leader == nil {
			return false, nil
		}
		pod, err := f.Client.CoreV1().Pods(ccmNamespace).Get(ctx, last.Status.Leader.Pod, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		img = gateImage(pod.Spec)
		return strings.HasSuffix(img, ":"+version), nil
	}); err != nil {
		t.Fatalf("NativeCCM %s: no leader of release %s (last leader's gate %q): %+v", name, version, img, last.Status)
	}
	return last
}

// hybridctlVersion runs `hybridctl version -o json` (built from this tree)
// against the cluster and returns the components it shows.
func hybridctlVersion(t *testing.T, ctx context.Context) []struct {
	Namespace, Name, Component string
	Versions                   []string
} {
	t.Helper()
	bin, err := testbin.Dev(t.TempDir(), "hybridctl")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, bin, "version", "-o", "json", "--kubeconfig", f.KubeconfigPath).Output()
	if err != nil {
		t.Fatalf("hybridctl version: %v\n%s", err, out)
	}
	var rep struct {
		Components []struct {
			Namespace, Name, Component string
			Versions                   []string
		}
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("hybridctl version -o json: %v\n%s", err, out)
	}
	return rep.Components
}

// checkout extracts commit of the repository at root into a new directory
// (git archive: the tree as committed, no .git).
func checkout(t *testing.T, ctx context.Context, root, commit string) string {
	t.Helper()
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("the previous release's commit %s is not in this clone (%v %s): a shallow clone lacks it; `git fetch --unshallow` brings it", commit, err, out)
	}
	dir := t.TempDir()
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit)
	extract := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	extract.Stdin = pipe
	var stderr strings.Builder
	archive.Stderr, extract.Stderr = &stderr, &stderr
	if err := extract.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v %s", commit, err, stderr.String())
	}
	if err := extract.Wait(); err != nil {
		t.Fatalf("tar -x: %v %s", err, stderr.String())
	}
	return dir
}

// versions are the previous release's version (its charts' appVersion) and
// the current one's: this tree's, or the next patch release when the tree has
// not moved its version on from the previous release's.
func versions(t *testing.T, prevRoot, root string) (string, string) {
	t.Helper()
	prev, err := ship.DefaultVersion(prevRoot)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := ship.DefaultVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	p, err := semver.StrictNewVersion(prev)
	if err != nil {
		t.Fatalf("previous release version %q: %v", prev, err)
	}
	c, err := semver.StrictNewVersion(cur)
	if err != nil {
		t.Fatalf("version %q: %v", cur, err)
	}
	if !c.GreaterThan(p) {
		cur = p.IncPatch().String()
	}
	return prev, cur
}

// installValues are testdata/values.yaml with the stand-in hcloud CCM
// pointed at its fake cloud.
func installValues(t *testing.T, cloudURL string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	hcloud := values["clouds"].(map[string]any)["hcloud"].(map[string]any)
	hcloud["overrides"] = map[string]any{"env": []any{map[string]any{"name": "TESTCCM_CLOUD_URL", "value": cloudURL}}}
	return values
}

// applyCRDs applies the CRDs of the charts (the umbrella's dependencies)
// with server-side apply, as `kubectl apply --server-side -f
// charts/ccm-coordinator/crds/` does.
func applyCRDs(ctx context.Context, charts []*chart.Chart) error {
	var data []byte
	for _, ch := range charts {
		for _, crd := range ch.CRDObjects() {
			data = append(append(data, crd.File.Data...), []byte("\n---\n")...)
		}
	}
	if len(data) == 0 {
		return errors.New("the new chart has no CRDs")
	}
	objs, err := fleet.DecodeManifests(data)
	if err != nil {
		return err
	}
	return f.ApplyManifests(ctx, objs)
}

// gateImage is the image of a native CCM pod's ccm-gate container.
func gateImage(spec corev1.PodSpec) string {
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if c.Name == "ccm-gate" {
			return c.Image
		}
	}
	return ""
}
