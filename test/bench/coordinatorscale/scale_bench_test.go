// Package coordinatorscale measures ccm-coordinator and one ccm-gate at scale:
// the real binaries (built from cmd/ccm-coordinator and cmd/ccm-gate, with the
// flags the ccm-coordinator chart ships) against a real kube-apiserver holding
// N nodes spread over 9 platforms, with 9 NativeCCMs whose releases Helm
// installs. Nothing runs the releases' pods (there is no kubelet): a
// simulated kubelet writes a Running pod per release Deployment, and a
// simulated leader renews each release's Lease as a healthy native CCM
// does, with the lease duration and retry period the coordinator enforces.
//
// For each size it reports the coordinator's memory (peak anonymous memory,
// Go heap, and working set where it runs in a cgroup of its own), its CPU time
// (utime+stime) to bring every NativeCCM to Ready and Healthy after a
// restart, its API requests and CPU while idle (by verb and resource, from a
// counting proxy that is its only way to the API server), whether it read
// Helm's release storage while idle, the requests one node joining costs,
// and the gate's peak anonymous memory and CPU with its node cache of one
// platform.
//
// HYBRID_CCM_BENCH_NODES lists the sizes (default 1000,5000; make bench-10k
// adds 10000); HYBRID_CCM_BENCH_IDLE is the idle window (default two lease
// durations of the releases' leader election, 200 s).
package coordinatorscale

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/test/benchproc"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

const (
	namespace = "hybrid-ccm-system"
	// platforms, each with a NativeCCM of a profile derived from hcloud.
	platforms = 9
	// gateCCM is the ServiceAccount (kube-system) the gate's list is made as.
	gateCCM = "bench-native-ccm"
)

var (
	env      *testenv.Env
	k8s      client.Client
	workDir  string
	coordBin string
	gateBin  string
	floorBin string // the libraries' memory baseline, see floor/main.go
)

// leaseDuration and renewEvery are the leader election the coordinator
// enforces on every release (release.LeaseDuration, release.RetryPeriod).
var leaseDuration, renewEvery = mustDuration(release.LeaseDuration), mustDuration(release.RetryPeriod)

func mustDuration(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}

func platformName(i int) string { return fmt.Sprintf("scale-%d", i) }

func TestMain(m *testing.M) {
	if !testenv.BenchmarksRequested() {
		os.Exit(m.Run())
	}
	if _, err := testenv.AssetsDir(); err != nil {
		fmt.Fprintln(os.Stderr, "skipping coordinator scale benchmark:", err)
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "hybrid-ccm-bench-coordinatorscale-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workDir = dir
	coordBin = filepath.Join(dir, "ccm-coordinator")
	floorBin = filepath.Join(dir, "floor")
	for out, pkg := range map[string]string{coordBin: "./cmd/ccm-coordinator", floorBin: "./test/bench/coordinatorscale/floor"} {
		if err := benchproc.Build(testenv.RepoRoot(), out, pkg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if gateBin, err = gatetest.BuildGate(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := testenv.Run(m, testenv.Options{CRDDirectoryPaths: []string{gatetest.CRDs()}}, func(e *testenv.Env) { env = e })
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// sizes are the node counts of benchproc.Nodes (HYBRID_CCM_BENCH_NODES),
// each at least one node per platform.
func sizes(b *testing.B) []int {
	out, err := benchproc.Nodes()
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range out {
		if n < platforms {
			b.Fatalf("%s: %d nodes is fewer than one per platform (%d)", benchproc.NodesEnv, n, platforms)
		}
	}
	return out
}

func idleWindow(b *testing.B) time.Duration {
	if s := os.Getenv("HYBRID_CCM_BENCH_IDLE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("HYBRID_CCM_BENCH_IDLE: %v", err)
		}
		return d
	}
	return 2 * leaseDuration
}

// BenchmarkCoordinatorAtScale runs the sizes in order, adding nodes between
// them; each size gets a fresh coordinator and gate (their peaks are theirs).
func BenchmarkCoordinatorAtScale(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	profilesDir := setupCluster(ctx, b)
	go simulateCCMs(ctx)

	// Install the releases once (one node per platform), so that every size
	// measures a coordinator restarted over installed, healthy releases: the
	// steady state.
	created := 0
	addNodes(ctx, b, &created, platforms)
	{
		c := startCoordinator(b, profilesDir, "install")
		waitAll(ctx, b, created, 10*time.Minute)
		c.stop()
	}

	idle := idleWindow(b)
	var rows []string
	for _, n := range sizes(b) {
		if n < created {
			b.Fatalf("sizes must grow: %d after %d", n, created)
		}
		addNodes(ctx, b, &created, n)
		rows = append(rows, measure(ctx, b, profilesDir, n, &created, idle))
	}
	fmt.Printf("\nccm-coordinator (9 NativeCCMs) and one ccm-gate at scale; idle window %s\n", idle)
	fmt.Println("| nodes | coordinator peak anonymous (Go heap; working set; libraries' floor, anonymous) | coordinator CPU to Ready | idle requests/min | idle CPU | Helm storage reads idle | node join: requests (node LISTs) | gate peak anonymous | gate CPU |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
}

// measure starts a gate and a coordinator over n nodes and reports one row.
func measure(ctx context.Context, b *testing.B, profilesDir string, n int, created *int, idle time.Duration) string {
	// What controller-runtime, fluxcd/pkg/runtime and Helm's SDK occupy
	// before any work, measured beside the coordinator.
	floor, err := benchproc.Idle(b.Logf, floorBin, 2*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	g := startGate(ctx, b, n)
	defer g.Stop()
	// the gate is started by gatetest: its anonymous memory only
	gateMem := benchproc.WatchMemory(g.Cmd.Process.Pid, nil)
	defer gateMem.Stop()

	c := startCoordinator(b, profilesDir, fmt.Sprint(n))
	defer c.stop()
	start := time.Now()
	waitAll(ctx, b, *created, 10*time.Minute)
	toReady := time.Since(start)
	cpuReady := cpu(b, c.pid())
	b.Logf("%d nodes: coordinator memory at Ready: %s", n, c.proc.Memory())
	startup := c.counter.snapshot()

	// Let the startup's aftermath (the first health re-checks) pass.
	time.Sleep(15 * time.Second)
	s1, cpu1 := c.counter.snapshot(), cpu(b, c.pid())
	time.Sleep(idle)
	s2, cpu2 := c.counter.snapshot(), cpu(b, c.pid())
	quiet := s2.since(s1)
	perMin := float64(quiet.total()) / idle.Minutes()
	idleCPU := (cpu2 - cpu1).Seconds() / idle.Seconds()

	// One node of platform scale-0 joins.
	s3 := c.counter.snapshot()
	joinStart := time.Now()
	addNodes(ctx, b, created, *created+1)
	want := int32(0)
	for i := 0; i < *created; i++ {
		if i%platforms == 0 {
			want++
		}
	}
	waitFor(b, 2*time.Minute, func() bool {
		o := &v1.NativeCCM{}
		return k8s.Get(ctx, client.ObjectKey{Name: platformName(0)}, o) == nil && o.Status.Nodes == want
	})
	seen := time.Since(joinStart)
	time.Sleep(5 * time.Second)
	joinWindow := time.Since(joinStart)
	join := c.counter.snapshot().since(s3)

	// One list of the platform's nodes through the gate, as its CCM would.
	token, err := gatetest.ServiceAccountToken(ctx, env.Client, "kube-system", gateCCM)
	if err != nil {
		b.Fatal(err)
	}
	gated := rest.CopyConfig(g.Config)
	gated.BearerToken = token
	l, err := kubernetes.NewForConfigOrDie(gated).CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatalf("list through the gate: %v", err)
	}

	c.saveHeapProfile(b, n)
	coord, gate := c.proc.Memory(), gateMem.Stop()
	b.Logf("%d nodes: coordinator memory at the end: %s; gate: anonymous %.1f MiB", n, coord, gate.Anon)
	gateCPU := cpu(b, g.Cmd.Process.Pid)

	b.Logf("%d nodes: coordinator Ready in %s; startup requests %d (%s)", n, toReady.Round(time.Millisecond), startup.total(), describe(startup, 0))
	b.Logf("%d nodes: idle %s: %d requests (%.1f/min): %s; Helm storage reads %d; CPU %.2f s (%.2f%% of a core)",
		n, idle, quiet.total(), perMin, describe(quiet, idle.Minutes()), quiet.helmReads, (cpu2 - cpu1).Seconds(), 100*idleCPU)
	b.Logf("%d nodes: node join seen in status after %s; %d requests in %s: %s; Helm storage reads %d",
		n, seen.Round(time.Millisecond), join.total(), joinWindow.Round(time.Second), describe(join, 0), join.helmReads)
	b.Logf("%d nodes: gate listed %d nodes of %s; coordinator peak anonymous %.1f MiB (%.1f MiB above the %.1f MiB of a process that only links controller-runtime, fluxcd/pkg/runtime and Helm's SDK: %s), gate peak anonymous %.1f MiB",
		n, len(l.Items), platformName(0), coord.Anon, coord.Anon-floor.Anon, floor.Anon, floor, gate.Anon)
	b.ReportMetric(coord.Anon, fmt.Sprintf("coordinator-anon-MiB@%d", n))
	b.ReportMetric(coord.Heap, fmt.Sprintf("coordinator-heap-MiB@%d", n))
	if coord.WorkingSetMeasured {
		b.ReportMetric(coord.WorkingSet, fmt.Sprintf("coordinator-working-set-MiB@%d", n))
	}
	b.ReportMetric(floor.Anon, fmt.Sprintf("coordinator-floor-anon-MiB@%d", n))
	b.ReportMetric(gate.Anon, fmt.Sprintf("gate-anon-MiB@%d", n))
	b.ReportMetric(perMin, fmt.Sprintf("idle-req/min@%d", n))
	b.ReportMetric(100*idleCPU, fmt.Sprintf("idle-cpu-%%@%d", n))

	ws := "not measured"
	if coord.WorkingSetMeasured {
		ws = fmt.Sprintf("%.1f MiB", coord.WorkingSet)
	}
	return fmt.Sprintf("| %d | %.1f MiB (%.0f MiB; %s; %.1f MiB) | %.2f s (%s) | %.1f (%s) | %.2f%% of a core | %d | %d (%d) | %.1f MiB | %.2f s |",
		n, coord.Anon, coord.Heap, ws, floor.Anon, cpuReady.Seconds(), toReady.Round(100*time.Millisecond), perMin, describe(quiet, idle.Minutes()), 100*idleCPU,
		quiet.helmReads, join.total(), join.counts["list nodes"], gate.Anon, gateCPU.Seconds())
}

// describe lists a snapshot's counts, per minute when minutes > 0.
func describe(s snapshot, minutes float64) string {
	var parts []string
	for _, k := range s.keys() {
		if minutes > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f", k, float64(s.counts[k])/minutes))
		} else {
			parts = append(parts, fmt.Sprintf("%s %d", k, s.counts[k]))
		}
	}
	return strings.Join(parts, ", ")
}

// setupCluster creates what the ccm-coordinator chart and a user would: the
// release namespace, the credentials Secret, the lifecycle ClusterRole, the
// fence (with the prefixes of the profiles the coordinator loads), and 9
// NativeCCMs with their grants. It returns the profile overrides directory.
func setupCluster(ctx context.Context, b *testing.B) string {
	var err error
	if k8s, err = gatetest.Client(env.Config); err != nil {
		b.Fatal(err)
	}
	must := func(err error) {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	must(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}))
	must(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hcloud", Namespace: namespace}, StringData: map[string]string{"token": "bench"}}))
	must(k8s.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: release.LifecycleClusterRole}, Rules: release.LifecycleRules()}))

	set, err := profile.Builtin()
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(workDir, "profiles")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	for i := range platforms {
		p, _ := set.Get("hcloud")
		p.Name, p.Platforms, p.CCM.SecurePort = platformName(i), []string{platformName(i)}, int32(10400+i)
		data, err := yaml.Marshal(p)
		if err != nil {
			b.Fatal(err)
		}
		file := filepath.Join(dir, p.Name+".yaml")
		if err := os.WriteFile(file, data, 0o644); err != nil {
			b.Fatal(err)
		}
		if err := set.Override(file, data); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := gate.EnsureFence(ctx, k8s, gate.Fence{Namespace: namespace, ProviderIDPrefixes: gate.SetPrefixTable(set)}); err != nil {
		b.Fatal(err)
	}
	for i := range platforms {
		obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: platformName(i)}, Spec: v1.NativeCCMSpec{Platform: platformName(i), Profile: platformName(i)}}
		if err := gate.EnsureGrant(ctx, k8s, gate.GrantFor(obj, namespace)); err != nil {
			b.Fatal(err)
		}
		must(k8s.Create(ctx, obj))
	}
	must(gatetest.GrantNativeCCM(ctx, env.Client, "kube-system", gateCCM))
	return dir
}

// addNodes creates nodes until there are n, round-robin over the platforms.
func addNodes(ctx context.Context, b *testing.B, created *int, n int) {
	specs := make([]gatetest.NodeSpec, 0, n-*created)
	for i := *created; i < n; i++ {
		specs = append(specs, gatetest.NodeSpec{
			Name: fmt.Sprintf("node-%05d", i), Platform: platformName(i % platforms),
			ProviderID: fmt.Sprintf("hcloud://%d", i), Ready: true,
		})
	}
	if err := gatetest.CreateNodes(ctx, env.Client, specs...); err != nil {
		b.Fatal(err)
	}
	*created = n
}

// waitAll waits until every NativeCCM is Ready and Healthy and counts its
// platform's nodes.
func waitAll(ctx context.Context, b *testing.B, nodes int, timeout time.Duration) {
	waitFor(b, timeout, func() bool {
		var list v1.NativeCCMList
		if err := k8s.List(ctx, &list); err != nil || len(list.Items) != platforms {
			return false
		}
		for i := range list.Items {
			o := &list.Items[i]
			want := int32(0)
			for n := 0; n < nodes; n++ {
				if platformName(n%platforms) == o.Spec.Platform {
					want++
				}
			}
			if !conditions.IsTrue(o, meta.ReadyCondition) || !conditions.IsTrue(o, v1.HealthyCondition) ||
				o.Status.Nodes != want || o.Status.ObservedGeneration != o.Generation {
				return false
			}
		}
		return true
	})
}

func waitFor(b *testing.B, timeout time.Duration, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("timed out")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// coordinatorProcess is a running ccm-coordinator behind its counting proxy.
type coordinatorProcess struct {
	proc    *benchproc.Process
	counter *counter
	server  *http.Server
	log     string
	pprof   string // its --pprof-addr, with profilesEnv only
}

// With benchproc.ProfilesEnv set, the coordinator serves pprof on loopback
// and its heap profile at the end of each size is saved there
// (coordinator-heap-<nodes>.pprof, `go tool pprof -sample_index=inuse_space`).
const profilesEnv = benchproc.ProfilesEnv

// saveHeapProfile saves the coordinator's heap profile (after a GC) to
// profilesEnv's directory, if set.
func (c *coordinatorProcess) saveHeapProfile(b *testing.B, n int) {
	dir := os.Getenv(profilesEnv)
	if dir == "" || c.pprof == "" {
		return
	}
	path := filepath.Join(dir, fmt.Sprintf("coordinator-heap-%d.pprof", n))
	if err := benchproc.SaveProfile(&http.Client{Timeout: time.Minute}, "http://"+c.pprof+"/debug/pprof/heap?gc=1", path); err != nil {
		b.Log(err)
		return
	}
	b.Logf("coordinator heap profile saved to %s", path)
}

func (c *coordinatorProcess) pid() int { return c.proc.Pid() }

func (c *coordinatorProcess) stop() {
	if c.proc.Cmd.ProcessState == nil {
		c.proc.Stop(syscall.SIGTERM, 30*time.Second)
	}
	_ = c.server.Close()
}

// startCoordinator runs ccm-coordinator with the chart's default flags (but
// --helm-wait=false: no kubelet makes the workloads ready) and a kubeconfig
// whose server is the counting proxy.
func startCoordinator(b *testing.B, profilesDir, tag string) *coordinatorProcess {
	cnt, err := newCounter(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: cnt, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	kubeconfig := filepath.Join(workDir, "coordinator-"+tag+".kubeconfig")
	if err := gatetest.WriteKubeconfig(&rest.Config{Host: "http://" + l.Addr().String()}, kubeconfig); err != nil {
		b.Fatal(err)
	}
	logPath := filepath.Join(workDir, "coordinator-"+tag+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = logFile.Close() })
	// The chart's arguments and values.yaml defaults.
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--release-namespace=" + namespace,
		"--uninstall-grace-period=10m",
		"--interval=10m",
		"--wait-interval=30s",
		"--helm-wait=false",
		"--helm-timeout=5m",
		"--concurrent=4",
		"--log-level=info",
		"--enable-leader-election=true",
		"--gate-image=ghcr.io/hybrid-ccm/ccm-gate:bench",
		"--profile-overrides=" + profilesDir,
		"--metrics-addr=" + gatetest.FreePort(),
		"--health-addr=" + gatetest.FreePort(),
	}
	var pprof string
	if os.Getenv(profilesEnv) != "" {
		pprof = gatetest.FreePort()
		args = append(args, "--pprof-addr="+pprof)
	}
	proc, err := benchproc.Start(b.Logf, "coordinator-"+tag, logFile, coordBin, args...)
	if err != nil {
		b.Fatal(err)
	}
	c := &coordinatorProcess{proc: proc, counter: cnt, server: srv, log: logPath, pprof: pprof}
	b.Cleanup(c.stop)
	return c
}

// startGate runs ccm-gate for platform scale-0 and waits until its node
// cache has synced (readyz).
func startGate(ctx context.Context, b *testing.B, n int) *gatetest.Gate {
	dir := filepath.Join(workDir, fmt.Sprintf("gate-%d", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := benchproc.ColdStart(b.Logf, gateBin); err != nil {
		b.Fatal(err)
	}
	g, err := gatetest.StartGate(gateBin, dir, platformName(0), env.Config, "")
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// simulateCCMs is the kubelet and the leading native CCM of every release:
// for each release Deployment, a Running pod, and the release's Lease held
// by that pod and renewed every renewEvery. It talks to the API server
// directly (its requests are not the coordinator's).
func simulateCCMs(ctx context.Context) {
	var mu sync.Mutex
	renewed := map[string]time.Time{}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var deps appsv1.DeploymentList
		if err := k8s.List(ctx, &deps, client.InNamespace(namespace), client.HasLabels{release.NativeCCMLabel}); err != nil {
			continue
		}
		for i := range deps.Items {
			d := &deps.Items[i]
			pod := d.Name + "-sim"
			if err := ensureRunning(ctx, d, pod); err != nil {
				continue
			}
			for _, ctr := range d.Spec.Template.Spec.Containers {
				w, ok := controller.ParseCCMContainer("Deployment/"+d.Namespace+"/"+d.Name, ctr)
				if !ok {
					continue
				}
				key := w.LeaseNamespace + "/" + w.LeaseName
				mu.Lock()
				due := time.Since(renewed[key]) >= renewEvery
				mu.Unlock()
				if due && renew(ctx, w.LeaseNamespace, w.LeaseName, pod+"_bench") == nil {
					mu.Lock()
					renewed[key] = time.Now()
					mu.Unlock()
				}
			}
		}
	}
}

// ensureRunning creates pod name of Deployment d, as its ReplicaSet would,
// and reports it Running, as its kubelet would.
func ensureRunning(ctx context.Context, d *appsv1.Deployment, name string) error {
	p := &corev1.Pod{}
	err := k8s.Get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: name}, p)
	if apierrors.IsNotFound(err) {
		labels := map[string]string{"pod-template-hash": "5b8c7d9f6"}
		for k, v := range d.Spec.Template.Labels {
			labels[k] = v
		}
		p = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.Namespace, Labels: labels, GenerateName: d.Name + "-5b8c7d9f6-"},
			Spec:       *d.Spec.Template.Spec.DeepCopy(),
		}
		if err = k8s.Create(ctx, p); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	if p.Status.Phase == corev1.PodRunning {
		return nil
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning}
	for _, ctr := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: ctr.Name, Image: ctr.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
		})
	}
	return k8s.Status().Update(ctx, p)
}

// renew writes the Lease as client-go's leader election does for a leader.
func renew(ctx context.Context, ns, name, holder string) error {
	now := metav1.NowMicro()
	l := &coordinationv1.Lease{}
	err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, l)
	if err != nil {
		return err // the coordinator creates it
	}
	s := &l.Spec
	if s.HolderIdentity == nil || *s.HolderIdentity != holder {
		s.AcquireTime = &now
		s.LeaseTransitions = ptr.To(ptr.Deref(s.LeaseTransitions, 0) + 1)
	}
	s.HolderIdentity, s.LeaseDurationSeconds, s.RenewTime = ptr.To(holder), ptr.To(int32(leaseDuration/time.Second)), &now
	return k8s.Update(ctx, l)
}

// cpu is a process' CPU time so far (utime+stime).
func cpu(b *testing.B, pid int) time.Duration {
	d := benchproc.CPU(pid)
	if d == 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid)); err != nil {
			b.Fatal(err)
		}
	}
	return d
}
