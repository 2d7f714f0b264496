// Package talosccm benchmarks node initialization by the real talos-ccm binary
// against a real kube-apiserver. The figure is compared to its floor
// (test/writefloor): the registrations and talos-ccm's writes, counted by the
// API server, priced at the API server's parallel ceiling for the same writes
// (by as many workers as talos-ccm has), measured in the same run.
package talosccm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/app"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
	"github.com/hybrid-ccm/hybrid-ccm/test/writefloor"
)

var (
	env   *testenv.Env
	bin   string
	floor string // the framework's memory baseline, see floor/main.go
)

func TestMain(m *testing.M) {
	if !testenv.BenchmarksRequested() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "hybrid-ccm-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, floor = filepath.Join(dir, "talos-ccm"), filepath.Join(dir, "floor")
	for out, pkg := range map[string]string{bin: "../../../cmd/talos-ccm", floor: "./floor"} {
		if msg, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, msg)
			os.Exit(1)
		}
	}
	code := testenv.Run(m, testenv.Options{}, func(e *testenv.Env) { env = e })
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

const (
	nodes        = 1000
	talosLatency = 20 * time.Millisecond
	// registrants is how many kubelets register at the same time.
	registrants = 32
)

func ipOf(i int) string { return fmt.Sprintf("10.%d.%d.%d", 100+i/65536, (i/256)%256, i%256) }

// registration is a Node as a kubelet registers it when the cloud provider is
// external: the uninitialized taint and the provided node IP.
func registration(name, ip string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: ip}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	}
}

// Kinds of write in a node's initialization: the kubelet's registration, then
// talos-ccm's update (providerID, labels, annotations, taints) and status update
// (addresses).
var (
	registerWrite = writefloor.Kind{Verb: "POST", Resource: "nodes"}
	updateWrite   = writefloor.Kind{Verb: "PUT", Resource: "nodes"}
	statusWrite   = writefloor.Kind{Verb: "PUT", Resource: "nodes", Subresource: "status"}
)

// ceiling measures the API server's ceiling for the writes of the nodes in
// done, issued as in the figure but with nothing else to do, on new nodes of
// the same shape named prefix-i (deleted again): the same registrations by as
// many registrants, and once a node is registered, the same update and status
// update as talos-ccm wrote, one after the other, by as many workers as
// talos-ccm has.
func ceiling(b *testing.B, prefix string, done []corev1.Node, registrants, workers int) writefloor.Ceiling {
	ctx := context.Background()
	cs := env.Client.CoreV1().Nodes()
	created := make([]*corev1.Node, len(done))
	register := writefloor.Stage{Kinds: []writefloor.Kind{registerWrite}, Workers: registrants, Write: func(i int) (err error) {
		created[i], err = cs.Create(ctx, registration(prefix+"-"+strconv.Itoa(i), done[i].Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr]), metav1.CreateOptions{})
		return err
	}}
	initialize := writefloor.Stage{Kinds: []writefloor.Kind{updateWrite, statusWrite}, Workers: workers, Write: func(i int) error {
		n := created[i].DeepCopy()
		n.ManagedFields = nil // talos-ccm's node cache holds none
		n.Spec.ProviderID, n.Spec.Taints = done[i].Spec.ProviderID, done[i].Spec.Taints
		n.Labels, n.Annotations = done[i].Labels, done[i].Annotations
		n, err := cs.Update(ctx, n, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		n.ManagedFields = nil
		n.Status.Addresses = done[i].Status.Addresses
		_, err = cs.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}}
	c := writefloor.MeasureStages(b, len(done), register, initialize)
	parallelDo(len(done), registrants, func(i int) { _ = cs.Delete(ctx, prefix+"-"+strconv.Itoa(i), metav1.DeleteOptions{}) })
	return c
}

func parallelDo(n, workers int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// procMiB reads a kB field of /proc/<pid>/status (VmHWM: peak RSS; RssAnon:
// heap, stacks; RssFile: the binary's mapped pages) in MiB.
func procMiB(pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v / 1024
		}
	}
	return 0
}

// exeMiB sums the resident pages of the process's executable mappings with
// the given permissions (r-xp: code, r--p: read-only data) in MiB.
func exeMiB(pid int, perms string) float64 {
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil || exe == "" {
		return 0
	}
	var kb float64
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			in = len(f) == 6 && f[5] == exe && f[1] == perms
		case in && len(f) >= 2 && f[0] == "Rss:":
			v, _ := strconv.ParseFloat(f[1], 64)
			kb += v
		}
	}
	return kb / 1024
}

// floorMiB starts the floor binary, lets its package initialization finish and
// returns its peak RSS: what any CCM built on k8s.io/cloud-provider/app occupies
// before it does anything.
func floorMiB(b *testing.B) float64 {
	cmd := exec.Command(floor)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	time.Sleep(2 * time.Second)
	return procMiB(cmd.Process.Pid, "VmHWM")
}

// BenchmarkInitialize1000Nodes registers 1000 nodes at once (as kubelets do)
// whose Talos API answers after 20 ms, and measures the time until talos-ccm,
// with the defaults the chart ships, has initialized all of them. The writes in
// that window (the registrations, talos-ccm's update and status update per
// node) are counted by the API server and priced at its ceiling for the same
// writes issued the same way with nothing else to do (see ceiling): the
// registrations by as many registrants, talos-ccm's writes by as many workers
// as talos-ccm has (--concurrent-node-syncs).
func BenchmarkInitialize1000Nodes(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base := floorMiB(b)

	ep, err := talosnode.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer ep.Stop()
	for i := range nodes + 1 {
		name := "bench-" + strconv.Itoa(i)
		n, err := ep.AddNode(name, []string{ipOf(i)}, talosnode.Spec{
			Metadata:  &runtime.PlatformMetadataSpec{Platform: "aws", Hostname: name, Region: "us-east-1", Zone: "us-east-1a", InstanceType: "m5.large", InstanceID: "i-" + strconv.Itoa(i), ProviderID: "aws:///us-east-1a/i-" + strconv.Itoa(i)},
			Addresses: []talosnode.Address{{Link: "eth0", Prefix: ipOf(i) + "/8"}, {Link: "external", Prefix: fmt.Sprintf("198.51.%d.%d/32", i/256, i%256)}},
		})
		if err != nil {
			b.Fatal(err)
		}
		n.SetLatency(talosLatency)
	}
	tc := filepath.Join(b.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(tc, "os:reader"); err != nil {
		b.Fatal(err)
	}
	logs, _ := os.Create(filepath.Join(b.TempDir(), "talos-ccm.log"))
	cmd := exec.Command(bin, "--kubeconfig="+env.KubeconfigPath, "--authentication-kubeconfig="+env.KubeconfigPath,
		"--authorization-kubeconfig="+env.KubeconfigPath, "--talosconfig="+tc, "--leader-elect=false", "--secure-port=0", "--v=1")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	// watch for initialized nodes from the test side
	var done atomic.Int64
	allDone := make(chan struct{})
	seen := sync.Map{}
	factory := informers.NewSharedInformerFactory(env.Client, 0)
	inf := factory.Core().V1().Nodes().Informer()
	check := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok || !strings.HasPrefix(n.Name, "bench-") || n.Name == "bench-"+strconv.Itoa(nodes) {
			return
		}
		for _, t := range n.Spec.Taints {
			if t.Key == cloudproviderapi.TaintExternalCloudProvider {
				return
			}
		}
		if len(n.Status.Addresses) == 0 || n.Spec.ProviderID == "" {
			return
		}
		if _, loaded := seen.LoadOrStore(n.Name, true); !loaded && done.Add(1) == nodes {
			close(allDone)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: check, UpdateFunc: func(_, n any) { check(n) }})
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	register := func(i int) {
		if _, err := env.Client.CoreV1().Nodes().Create(ctx, registration("bench-"+strconv.Itoa(i), ipOf(i)), metav1.CreateOptions{}); err != nil {
			b.Error(err)
		}
	}
	// warm-up: one canary node proves talos-ccm is up and synced (its
	// writes, the status update last, are done before the window opens)
	register(nodes)
	for deadline := time.Now().Add(2 * time.Minute); ; {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, "bench-"+strconv.Itoa(nodes), metav1.GetOptions{})
		if err == nil && n.Spec.ProviderID != "" && len(n.Status.Addresses) > 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("talos-ccm did not initialize the canary node")
		}
		time.Sleep(50 * time.Millisecond)
	}

	idle := procMiB(cmd.Process.Pid, "VmRSS")
	window := writefloor.Open(b, env.Client)
	b.ResetTimer()
	start := time.Now()
	parallelDo(nodes, registrants, register)
	select {
	case <-allDone:
	case <-time.After(10 * time.Minute):
		b.Fatalf("only %d/%d nodes initialized", done.Load(), nodes)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	writes := window.Close(b)

	rss := procMiB(cmd.Process.Pid, "VmHWM")
	anon, file := procMiB(cmd.Process.Pid, "RssAnon"), procMiB(cmd.Process.Pid, "RssFile")
	code, rodata := exeMiB(cmd.Process.Pid, "r-xp"), exeMiB(cmd.Process.Pid, "r--p")

	// The floor: the same writes at the API server's ceiling, measured once
	// talos-ccm is gone (it would otherwise sync the ceiling's nodes) and its
	// nodes are deleted (the API server holds as many nodes as it did); the
	// faster of two rounds.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	list, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	initialized := make([]corev1.Node, nodes)
	for _, n := range list.Items {
		if i, err := strconv.Atoi(strings.TrimPrefix(n.Name, "bench-")); err == nil && i < nodes {
			initialized[i] = n
		}
	}
	if err := env.Client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
	workers := app.DefaultConcurrentNodeSyncs
	best := writefloor.Best(ceiling(b, "ceiling-a", initialized, registrants, workers), ceiling(b, "ceiling-b", initialized, registrants, workers))
	apiFloor := writefloor.Floor{Writes: writes, Ceilings: best, Objects: nodes}

	b.ReportMetric(rss, "talos-ccm-rss-MiB")
	b.ReportMetric(anon, "talos-ccm-anon-MiB")
	b.ReportMetric(base, "framework-floor-rss-MiB")
	b.Logf("%d nodes registered at once (%d registrants, 20 ms Talos latency), talos-ccm with %d workers: %s",
		nodes, registrants, workers, apiFloor.Report(b, "init", elapsed))
	b.Logf("talos-ccm peak RSS %.1f MiB (at the end: anonymous %.1f MiB, binary file pages %.1f MiB), %.1f MiB above the %.1f MiB peak RSS of a process that only links k8s.io/cloud-provider/app; Talos requests %d",
		rss, anon, file, rss-base, base, ep.Requests())
	b.Logf("talos-ccm RSS when started and idle: %.1f MiB; at the end the binary's pages are %.1f MiB code and %.1f MiB read-only data", idle, code, rodata)
}
