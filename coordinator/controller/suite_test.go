package controller

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runtimectrl "github.com/fluxcd/pkg/runtime/controller"
	"github.com/fluxcd/pkg/runtime/events"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const releaseNamespace = "hybrid-ccm-system"

// testLeaseDuration is the lease duration the reconciler assumes before a
// lease exists (and waits half of between looks at a CCM that is not healthy).
const testLeaseDuration = 4 * time.Second

// gateImage is the ccm-gate image of the gated releases.
const gateImage = "ghcr.io/hybrid-ccm/ccm-gate:test"

var (
	env      *testenv.Env
	k8s      client.Client
	profiles *lockedProfiles
	// chartRepo serves fake upstream charts on loopback.
	chartRepo *httptest.Server
	// engine is the reconciler's Helm engine, with the faults a test asks for.
	engine *faultEngine
)

// faultEngine is the suite's Helm engine, through which a test makes an
// upgrade fail as one does in a cluster: duringUpgrade[release] runs after
// the real upgrade (what a person does while an upgrade waits for its
// pods), and the upgrade then fails as one whose wait timed out, once.
//
// duringInstall[release] runs after the real install, which then succeeds
// (what happens while an install waits for its pods), once.
type faultEngine struct {
	ReleaseEngine
	duringUpgrade sync.Map // release name -> func()
	duringInstall sync.Map // release name -> func()
}

func (e *faultEngine) Install(ctx context.Context, req release.Request) (*release.Info, error) {
	info, err := e.ReleaseEngine.Install(ctx, req)
	if f, ok := e.duringInstall.Load(req.Name); ok && err == nil {
		f.(func())()
		e.duringInstall.Delete(req.Name)
	}
	return info, err
}

func (e *faultEngine) Upgrade(ctx context.Context, req release.Request) (*release.Info, error) {
	info, err := e.ReleaseEngine.Upgrade(ctx, req)
	if f, ok := e.duringUpgrade.Load(req.Name); ok && err == nil {
		// removed once done: a test waits for that to look at the outcome
		f.(func())()
		e.duringUpgrade.Delete(req.Name)
		return info, fmt.Errorf("upgrade of %s: context deadline exceeded (injected: its pods did not become ready)", req.Name)
	}
	return info, err
}

func TestMain(m *testing.M) {
	// No skipping: without KUBEBUILDER_ASSETS testenv.Start fails and so does
	// the package.
	e, err := testenv.Start(testenv.Options{
		CRDDirectoryPaths: []string{filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator", "crds")},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := setup(ctx, e)
	code := m.Run()
	// Stop the manager before the control plane, so it never talks to a dead server.
	cancel()
	<-stopped
	_ = e.Stop()
	os.Exit(code)
}

func setup(ctx context.Context, e *testenv.Env) <-chan struct{} {
	env = e
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapLevel())))
	must := func(err error) {
		if err != nil {
			fmt.Fprintln(os.Stderr, "setup:", err)
			os.Exit(1)
		}
	}
	chartRepo = newChartRepo(map[string]map[string]string{
		"fake-ccm": upstreamChart(""),
		"broken":   upstreamChart(brokenObject),
	})

	set, err := profile.Builtin()
	must(err)
	profiles = &lockedProfiles{set: set}
	must(deriveProfile("hcloud", "hcloud-a", 10301, nil))
	must(deriveProfile("hcloud", "hcloud-b", 10302, nil))
	must(deriveProfile("hcloud", "hcloud-c", 10303, nil))
	must(deriveProfile("hcloud", "hcloud-d", 10304, nil))
	must(deriveProfile("hcloud", "hcloud-e", 10305, nil))
	must(deriveProfile("aws", "aws-a", 10306, nil))
	// upstream installs the fake upstream chart from the repository with args.
	upstream := func(args map[string]any) func(*profile.Profile) {
		return func(p *profile.Profile) {
			p.Chart = profile.Chart{
				Source: profile.ChartRepository, Repository: chartRepo.URL, Name: "fake-ccm", Version: "^1.0.0",
				Values: map[string]any{
					"secretName": "{{ .SecretName }}",
					"image":      "{{ .Image.Repository }}:{{ .Image.Tag }}",
					"args":       args,
				},
			}
		}
	}
	must(deriveProfile("hcloud", "upstream-a", 10307, upstream(map[string]any{"allow-untagged-cloud": "true"})))
	must(deriveProfile("hcloud", "broken-a", 10308, func(p *profile.Profile) {
		p.Chart = profile.Chart{Source: profile.ChartRepository, Repository: chartRepo.URL, Name: "broken", Version: "1.0.0"}
	}))
	must(deriveProfile("hcloud", "always-a", 10309, nil))
	must(deriveProfile("hcloud", "suspend-a", 10310, nil))
	must(deriveProfile("hcloud", "profile-a", 10311, nil))
	must(deriveProfile("hcloud", "lease-a", 10312, nil))
	must(deriveProfile("hcloud", "fence-a", 10313, nil))
	must(deriveProfile("hcloud", "fence-b", 10317, nil))
	// a release installed before its NativeCCM says so
	must(deriveProfile("hcloud", "adopt-a", 10318, nil))
	// the gate only for a release that is wanted
	must(deriveProfile("hcloud", "gate-wanted-a", 10319, nil))
	// an upstream chart that points its CCM at an API server itself
	must(deriveProfile("hcloud", "upstream-b", 10314, upstream(map[string]any{
		"allow-untagged-cloud": "true", "kubeconfig": "/etc/kubernetes/ccm.conf", "master": "https://10.0.0.1:6443"})))
	// the health tests drive the pods and leases of these releases themselves
	must(deriveProfile("hcloud", "health-a", 10315, nil))
	must(deriveProfile("hcloud", "health-b", 10316, nil))
	// load balancers: three CCMs of one cloud, and a cloud that cannot
	must(deriveProfile("hcloud", "lb-a", 10320, nil))
	must(deriveProfile("hcloud", "lb-b", 10321, nil))
	must(deriveProfile("hcloud", "lb-c", 10322, nil))
	must(deriveProfile("hcloud", "lb-no", 10323, func(p *profile.Profile) {
		p.LoadBalancers = &profile.LoadBalancers{Unsupported: "this test cloud has no load balancers"}
	}))
	// image pull Secrets of a NativeCCM's own
	must(deriveProfile("hcloud", "pull-a", 10326, nil))
	must(deriveProfile("hcloud", "quiet-a", 10327, nil))
	// profiles that know their boundary, as aws's and openstack's do
	regional := func(p *profile.Profile) { p.Domain = &profile.Domain{BoundaryLabel: "topology.kubernetes.io/region"} }
	must(deriveProfile("hcloud", "domain-a", 10328, regional))
	must(deriveProfile("hcloud", "domain-b", 10329, regional))
	must(deriveProfile("hcloud", "domain-c", 10331, regional))
	must(deriveProfile("hcloud", "lb-d", 10330, nil))
	// aws's profile, which splits by region (domain.cloudConfigRegion)
	must(deriveProfile("aws", "split-a", 10332, nil))
	must(deriveProfile("aws", "split-b", 10333, nil))
	must(deriveProfile("aws", "split-c", 10339, nil))
	// a NativeCCM that takes over from a CCM the cluster runs
	must(deriveProfile("hcloud", "takeover-a", 10340, nil))
	must(deriveProfile("aws", "takeover-split", 10341, nil))
	must(deriveProfile("hcloud", "takeover-byhand", 10342, nil))
	must(deriveProfile("aws", "takeover-split-byhand", 10343, nil))
	must(deriveProfile("hcloud", "takeover-keephistory", 10344, nil))
	must(deriveProfile("aws", "takeover-split-lease", 10345, nil))
	must(deriveProfile("hcloud", "takeover-norollback", 10346, nil))
	must(deriveProfile("hcloud", "takeover-upgradefailed", 10347, nil))
	must(deriveProfile("aws", "takeover-split-norollback", 10348, nil))
	must(deriveProfile("aws", "takeover-split-again", 10349, nil))

	// the upstream CCM per Kubernetes minor: Azure's (with its own node
	// filter), and a profile whose only release is two minors older than
	// the API server
	must(deriveProfile("azure", "azure-a", 10324, nil))
	info, err := discovery.NewDiscoveryClientForConfigOrDie(e.Config).ServerVersion()
	must(err)
	serverMinor, err := profile.ServerMinor(info.GitVersion)
	must(err)
	must(deriveProfile("azure", "skew-a", 10325, func(p *profile.Profile) {
		p.CCM.Image.Tags = map[string]string{profile.MinorString(serverMinor - 2): "v1.0.0-old"}
	}))

	k8s, err = client.New(e.Config, client.Options{Scheme: NewScheme()})
	must(err)
	must(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNamespace}}))
	// The image pull Secret the coordinator gives every native CCM (the
	// ccm-gate image comes from the product's registry).
	must(k8s.Create(ctx, dockerConfigSecret(coordinatorPullSecret)))

	// The manager's and Helm's requests are counted (quiet_test.go).
	mgrCfg, engineCfg := rest.CopyConfig(e.Config), rest.CopyConfig(e.Config)
	mgrCfg.Wrap(managerRequests.wrap)
	engineCfg.Wrap(helmRequests.wrap)
	mgr, err := ctrl.NewManager(mgrCfg, ctrl.Options{
		Scheme:  NewScheme(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   CacheOptions(releaseNamespace),
	})
	must(err)
	// What the ccm-coordinator chart ships: the ClusterRole native CCMs are bound to.
	must(k8s.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: release.LifecycleClusterRole}, Rules: release.LifecycleRules()}))
	// What the chart ships too: the fence, for the native CCMs of the release
	// namespace, with the providerID prefixes of the profiles the coordinator
	// runs with (the chart renders them from its profileOverrides). The
	// coordinator reads it as a user with exactly the chart's right (get, by
	// name) whose permission TestTransientFenceErrorIsRetried takes away for
	// a while.
	_, err = gate.EnsureFence(ctx, k8s, gate.Fence{Namespace: releaseNamespace, ProviderIDPrefixes: gate.SetPrefixTable(profiles.set)})
	must(err)
	must(k8s.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: fenceReader},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"admissionregistration.k8s.io"},
			Resources:     []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"},
			ResourceNames: []string{gate.DefaultFenceName},
			Verbs:         []string{"get"}}}}))
	must(k8s.Create(ctx, fenceReaderBinding()))
	fenceCfg, err := e.AddUser(fenceReader)
	must(err)
	fenceClient, err := client.New(fenceCfg, client.Options{Scheme: NewScheme()})
	must(err)
	rec, err := events.NewRecorder(ctrl.Log, "", names.CoordinatorController, events.WithManager(mgr))
	must(err)
	engine = &faultEngine{ReleaseEngine: helm.NewEngine(engineCfg, helm.Options{Wait: false, Timeout: time.Minute, Log: ctrl.Log.WithName("helm")})}
	r := &NativeCCMReconciler{
		Client:        mgr.GetClient(),
		APIReader:     mgr.GetAPIReader(),
		EventRecorder: rec,
		Engine:        engine,
		Profiles:      profiles,
		// The gate, wired as cmd/ccm-coordinator wires it: every release is
		// checked against the fence, gets its parameters and the ccm-gate sidecar.
		Mutators:             gate.Coordinator{Client: mgr.GetClient(), Reader: fenceClient, Image: gateImage}.Mutators,
		Namespace:            releaseNamespace,
		ImagePullSecrets:     []string{coordinatorPullSecret},
		UninstallGracePeriod: 2 * time.Second,
		RetryInterval:        time.Second,
		Health:               HealthOptions{LeaseDuration: testLeaseDuration, CrashLoopRestarts: 3},
	}
	must(r.SetupWithManager(ctx, mgr, Options{
		MaxConcurrentReconciles: 4,
		RateLimiter:             runtimectrl.RateLimiterOptions{MinRetryDelay: 100 * time.Millisecond, MaxRetryDelay: 2 * time.Second},
	}))
	// kubelet and leader election for every release but those the health
	// tests drive, and the one whose lease a conflict test holds
	go runCCMs(ctx, k8s, func(rel string) bool {
		return strings.HasPrefix(rel, "native-ccm-health-") || rel == "native-ccm-lease-a"
	})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
			os.Exit(1)
		}
	}()
	return stopped
}

// fenceReader is the user (and ClusterRole) that reads the fence.
const fenceReader = "test:fence-reader"

func fenceReaderBinding() *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: fenceReader},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: fenceReader},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: fenceReader}}}
}

func zapLevel() zapcore.Level {
	if os.Getenv("COORDINATOR_TEST_DEBUG") != "" {
		return zapcore.Level(-4)
	}
	return zapcore.ErrorLevel
}

// lockedProfiles lets a test change a profile while the manager runs
// (profile.Set is not safe for concurrent use).
type lockedProfiles struct {
	mu  sync.RWMutex
	set *profile.Set
}

func (l *lockedProfiles) Get(name string) (*profile.Profile, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.set.Get(name)
}

// edit changes the named profile.
func (l *lockedProfiles) edit(name string, change func(*profile.Profile)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.set.Get(name)
	if !ok {
		return fmt.Errorf("no profile %s", name)
	}
	change(p)
	data, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	return l.set.Override("test/"+name+".yaml", data)
}

// deriveProfile adds a test profile: a copy of base with its own name,
// platform and port, optionally edited.
func deriveProfile(base, name string, port int32, edit func(*profile.Profile)) error {
	p, ok := profiles.Get(base)
	if !ok {
		return fmt.Errorf("no profile %s", base)
	}
	p.Name, p.Platforms, p.CCM.SecurePort = name, []string{name}, port
	if edit != nil {
		edit(p)
	}
	data, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	profiles.mu.Lock()
	defer profiles.mu.Unlock()
	return profiles.set.Override("test/"+name+".yaml", data)
}

const brokenObject = `---
apiVersion: v1
kind: ConfigMap
metadata:
  name: Not_A_Valid_Name
data: {}
`

// upstreamChart is a chart shaped like typical upstream CCM charts: default
// controllers and lease, a ServiceAccount bound to cluster-admin, flags from a
// values map. extra is appended to its templates.
func upstreamChart(extra string) map[string]string {
	return map[string]string{
		"Chart.yaml":  "apiVersion: v2\nname: NAME\nversion: 1.0.0\n",
		"values.yaml": "image: upstream/ccm:v0\nsecretName: hcloud\nargs: {}\n",
		"templates/ccm.yaml": releasetest.UpstreamCCMTemplate("", `          command: [/bin/ccm]
          args:
            - --cloud-provider=hcloud
            - --leader-elect=true
            {{- range $k, $v := .Values.args }}
            - --{{ $k }}={{ $v }}
            {{- end }}
`) + extra,
	}
}

// newChartRepo serves an HTTP chart repository (index.yaml + .tgz archives).
func newChartRepo(charts map[string]map[string]string) *httptest.Server {
	archives := map[string][]byte{}
	var index strings.Builder
	index.WriteString("apiVersion: v1\nentries:\n")
	for name, files := range charts {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		for path, content := range files {
			content = strings.ReplaceAll(content, "name: NAME", "name: "+name)
			_ = tw.WriteHeader(&tar.Header{Name: name + "/" + path, Mode: 0o644, Size: int64(len(content)), ModTime: time.Unix(0, 0)})
			_, _ = tw.Write([]byte(content))
		}
		_ = tw.Close()
		_ = gz.Close()
		file := name + "-1.0.0.tgz"
		archives["/"+file] = buf.Bytes()
		sum := sha256.Sum256(buf.Bytes())
		fmt.Fprintf(&index, "  %s:\n  - apiVersion: v2\n    name: %s\n    version: 1.0.0\n    urls: [%s]\n    digest: %s\n", name, name, file, hex.EncodeToString(sum[:]))
	}
	idx := index.String()
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/index.yaml" {
			_, _ = w.Write([]byte(idx))
			return
		}
		if a, ok := archives[r.URL.Path]; ok {
			_, _ = w.Write(a)
			return
		}
		http.NotFound(w, r)
	}))
}

// eventually polls cond for up to 90 s (see eventuallyWithin).
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	eventuallyWithin(t, 90*time.Second, what, cond)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
