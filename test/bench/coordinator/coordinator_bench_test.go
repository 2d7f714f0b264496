// Package bench measures ccm-coordinator against a real control plane: how long
// from the first node of a platform appearing until the native CCM release is
// deployed, next to a plain Helm SDK install of the same chart and values
// against the same API server in the same run.
package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	runtimectrl "github.com/fluxcd/pkg/runtime/controller"
	"github.com/fluxcd/pkg/runtime/events"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const (
	namespace = "hybrid-ccm-bench"
	platform  = "benchcloud"
	// rounds per benchmark iteration; the median of each side is reported.
	rounds = 5
)

var (
	env    *testenv.Env
	k8s    client.Client
	engine *helm.Engine
	set    *profile.Set
)

func TestMain(m *testing.M) {
	if !testenv.BenchmarksRequested() {
		os.Exit(m.Run())
	}
	if _, err := testenv.AssetsDir(); err != nil {
		fmt.Fprintln(os.Stderr, "skipping coordinator benchmark:", err)
		os.Exit(0)
	}
	e, err := testenv.Start(testenv.Options{
		CRDDirectoryPaths: []string{filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator", "crds")},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env = e
	ctx, cancel := context.WithCancel(context.Background())
	stopped, err := start(ctx)
	code := 1
	if err == nil {
		code = m.Run()
	} else {
		fmt.Fprintln(os.Stderr, err)
	}
	cancel()
	if stopped != nil {
		<-stopped
	}
	_ = e.Stop()
	os.Exit(code)
}

func start(ctx context.Context) (<-chan struct{}, error) {
	var err error
	if set, err = profile.Builtin(); err != nil {
		return nil, err
	}
	p, _ := set.Get("hcloud")
	p.Name, p.Platforms, p.CCM.SecurePort = platform, []string{platform}, 10390
	data, _ := yaml.Marshal(p)
	if err := set.Override("bench/"+platform+".yaml", data); err != nil {
		return nil, err
	}
	if k8s, err = client.New(env.Config, client.Options{Scheme: controller.NewScheme()}); err != nil {
		return nil, err
	}
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return nil, err
	}
	if err := k8s.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "hcloud", Namespace: namespace},
		StringData: map[string]string{"token": "bench"},
	}); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:  controller.NewScheme(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   controller.CacheOptions(namespace),
	})
	if err != nil {
		return nil, err
	}
	engine = helm.NewEngine(env.Config, helm.Options{Wait: false})
	rec, err := events.NewRecorder(logr.Discard(), "", names.CoordinatorController, events.WithManager(mgr))
	if err != nil {
		return nil, err
	}
	r := &controller.NativeCCMReconciler{
		Client:               mgr.GetClient(),
		APIReader:            mgr.GetAPIReader(),
		EventRecorder:        rec,
		Engine:               engine,
		Profiles:             set,
		Namespace:            namespace,
		UninstallGracePeriod: time.Hour,
	}
	if err := r.SetupWithManager(ctx, mgr, controller.Options{
		MaxConcurrentReconciles: 2,
		RateLimiter:             runtimectrl.RateLimiterOptions{MinRetryDelay: 50 * time.Millisecond, MaxRetryDelay: time.Second},
	}); err != nil {
		return nil, err
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return stopped, nil
}

// BenchmarkPlatformAppearsToReleaseDeployed: a NativeCCM for the platform
// exists (Ready, nothing installed); the first node of the platform is created;
// the clock stops when Helm has recorded the release as deployed. Baseline: a
// plain Helm SDK install of the same chart and values, timed until it returns
// (which is when it has recorded the release as deployed).
func BenchmarkPlatformAppearsToReleaseDeployed(b *testing.B) {
	ctx := context.Background()
	p, _ := set.Get(platform)
	var coord, plain []time.Duration
	for i := 0; i < b.N; i++ {
		for r := 0; r < rounds; r++ {
			name := fmt.Sprintf("bench-%d-%d", i, r)
			plain = append(plain, plainInstall(ctx, b, p, name))
			coord = append(coord, coordinatorInstall(ctx, b, name))
		}
	}
	c, h := median(coord), median(plain)
	b.ReportMetric(float64(c.Microseconds())/1000, "coordinator-ms")
	b.ReportMetric(float64(h.Microseconds())/1000, "helm-install-ms")
	b.ReportMetric(float64(c)/float64(h), "ratio")
	fmt.Printf("platform appears → release deployed: coordinator %v, plain Helm SDK install %v, ratio %.2f (median of %d)\n", c, h, float64(c)/float64(h), len(coord))
}

func plainInstall(ctx context.Context, b *testing.B, p *profile.Profile, name string) time.Duration {
	b.Helper()
	req, err := release.FromProfile(p, release.Instance{ReleaseName: "plain-" + name, Namespace: namespace, Platform: platform})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := helm.PlainInstall(ctx, env.Config, req); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	if err := engine.Uninstall(ctx, namespace, req.Name); err != nil {
		b.Fatal(err)
	}
	return d
}

func coordinatorInstall(ctx context.Context, b *testing.B, name string) time.Duration {
	b.Helper()
	obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{Platform: platform, Profile: platform}}
	if err := k8s.Create(ctx, obj); err != nil {
		b.Fatal(err)
	}
	waitFor(b, func() bool {
		o := &v1.NativeCCM{}
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(obj), o)
		return o.Status.ObservedGeneration == o.Generation && o.Status.Conditions != nil
	})

	// Watch Helm's release records before the node appears.
	w, err := env.Client.CoreV1().Secrets(namespace).Watch(ctx, metav1.ListOptions{
		LabelSelector: "owner=helm,status=deployed,name=" + obj.ReleaseName(),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{names.PlatformLabel: platform}}, Spec: corev1.NodeSpec{ProviderID: "hcloud://" + name}}
	start := time.Now()
	if err := k8s.Create(ctx, node); err != nil {
		b.Fatal(err)
	}
	var d time.Duration
	timeout := time.After(2 * time.Minute)
	for d == 0 {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				d = time.Since(start)
			}
		case <-timeout:
			b.Fatalf("release %s not deployed", obj.ReleaseName())
		}
	}

	// Clean up: the finalizer uninstalls.
	if err := k8s.Delete(ctx, obj); err != nil {
		b.Fatal(err)
	}
	if err := k8s.Delete(ctx, node); err != nil {
		b.Fatal(err)
	}
	waitFor(b, func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(obj), &v1.NativeCCM{}))
	})
	return d
}

func waitFor(b *testing.B, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration{}, d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
