// Package talosccm benchmarks node initialization by the real talos-ccm binary
// against a real kube-apiserver. The figure is compared to its floor
// (test/writefloor): the registrations and talos-ccm's writes, counted by the
// API server, priced at the API server's parallel ceiling for the same writes
// (by as many workers as talos-ccm has), measured in the same run.
package talosccm

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/app"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/benchproc"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
	"github.com/hybrid-ccm/hybrid-ccm/test/writefloor"
)

var (
	env   *testenv.Env
	bin   string
	floor string // the framework's memory baseline, see floor/main.go
	apid  string // the control planes' apid, see apid/main.go
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
	bin, floor, apid = filepath.Join(dir, "talos-ccm"), filepath.Join(dir, "floor"), filepath.Join(dir, "apid")
	for out, pkg := range map[string]string{bin: "./cmd/talos-ccm", floor: "./test/bench/talosccm/floor", apid: "./test/bench/talosccm/apid"} {
		if err := benchproc.Build(testenv.RepoRoot(), out, pkg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := testenv.Run(m, testenv.Options{}, func(e *testenv.Env) { env = e })
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

const (
	talosLatency = 20 * time.Millisecond
	// registrants is how many kubelets register at the same time.
	registrants = 32
)

// machineSpec is what the Talos machine of node name, number k, reports:
// what talos-ccm reads to initialize the node.
func machineSpec(name string, k int) talosnode.Spec {
	return talosnode.Spec{
		Metadata:  &runtime.PlatformMetadataSpec{Platform: "aws", Hostname: name, Region: "us-east-1", Zone: "us-east-1a", InstanceType: "m5.large", InstanceID: "i-" + strconv.Itoa(k), ProviderID: "aws:///us-east-1a/i-" + strconv.Itoa(k)},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: ipOf(k) + "/8"}, {Link: "external", Prefix: fmt.Sprintf("198.51.%d.%d/32", (k/256)%256, k%256)}},
	}
}

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
// (a merge patch of the addresses).
var (
	registerWrite = writefloor.Kind{Verb: "POST", Resource: "nodes"}
	updateWrite   = writefloor.Kind{Verb: "PUT", Resource: "nodes"}
	statusWrite   = writefloor.Kind{Verb: "PATCH", Resource: "nodes", Subresource: "status"}
)

// protobufConfig is the test API server's client configuration speaking
// protobuf, as talos-ccm does (the cloud-provider framework's default).
func protobufConfig() *rest.Config {
	c := rest.CopyConfig(env.Config)
	c.ContentType = k8sruntime.ContentTypeProtobuf
	c.AcceptContentTypes = k8sruntime.ContentTypeProtobuf + "," + k8sruntime.ContentTypeJSON
	return c
}

// ceiling measures the API server's ceiling for the writes of the nodes in
// done, issued as in the figure but with nothing else to do, on new nodes of
// the same shape named prefix-i (deleted again): the same registrations by as
// many registrants, and once a node is registered, the same update and status
// update as talos-ccm wrote, one after the other, by as many workers as
// talos-ccm has, encoded as talos-ccm encodes them (protobuf, the
// cloud-provider framework's default; the registrations are the benchmark's,
// JSON in both).
//
// It also returns the CPU time of the processes in pids while the writes were
// made.
func ceiling(b *testing.B, prefix string, done []corev1.Node, registrants, workers int, pids map[string]int) (writefloor.Ceiling, *benchproc.Share) {
	ctx := context.Background()
	cs := env.Client.CoreV1().Nodes()
	pcs := kubernetes.NewForConfigOrDie(protobufConfig()).CoreV1().Nodes()
	created := make([]*corev1.Node, len(done))
	register := writefloor.Stage{Kinds: []writefloor.Kind{registerWrite}, Workers: registrants, Write: func(i int) (err error) {
		created[i], err = cs.Create(ctx, registration(prefix+"-"+strconv.Itoa(i), done[i].Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr]), metav1.CreateOptions{})
		return err
	}}
	// The API server records who wrote which fields (managedFields, one entry
	// per field manager and subresource): talos-ccm's writes come from another
	// manager than the registration, as on a cluster (the kubelet registers,
	// the CCM initializes). The ceiling writes as the manager talos-ccm wrote
	// as, so that its nodes carry the same entries: with its own manager they
	// carried one entry fewer, a smaller object to store, encode and merge.
	manager := writer(b, done)
	initialize := writefloor.Stage{Kinds: []writefloor.Kind{updateWrite, statusWrite}, Workers: workers, Write: func(i int) error {
		n := created[i].DeepCopy()
		n.ManagedFields = nil // talos-ccm's node cache holds none
		n.Spec.ProviderID, n.Spec.Taints = done[i].Spec.ProviderID, done[i].Spec.Taints
		n.Labels, n.Annotations = done[i].Labels, done[i].Annotations
		if _, err := pcs.Update(ctx, n, metav1.UpdateOptions{FieldManager: manager}); err != nil {
			return err
		}
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"addresses": done[i].Status.Addresses}})
		if err != nil {
			return err
		}
		_, err = pcs.Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: manager}, "status")
		return err
	}}
	share := benchproc.StartShare(pids)
	c := writefloor.MeasureStages(b, len(done), register, initialize)
	share.Stop()
	if n, err := cs.Get(ctx, prefix+"-0", metav1.GetOptions{}); err != nil {
		b.Fatal(err)
	} else if got, want := owners(n), owners(&done[0]); !slices.Equal(got, want) {
		b.Fatalf("the ceiling's node records field managers %v, talos-ccm's %v: not the same writes", got, want)
	}
	parallelDo(len(done), registrants, func(i int) { _ = cs.Delete(ctx, prefix+"-"+strconv.Itoa(i), metav1.DeleteOptions{}) })
	return c, share
}

// writer is the field manager that wrote the status of the initialized nodes
// in done (talos-ccm's): only talos-ccm writes a node's status in a round.
func writer(b *testing.B, done []corev1.Node) string {
	managers := map[string]bool{}
	for _, n := range done {
		for _, f := range n.ManagedFields {
			if f.Subresource == "status" {
				managers[f.Manager] = true
			}
		}
	}
	if len(managers) != 1 {
		b.Fatalf("the round's nodes name %d field managers of their status (%v), not talos-ccm's alone: the ceiling cannot write as it did", len(managers), slices.Collect(maps.Keys(managers)))
	}
	for m := range managers {
		return m
	}
	return ""
}

// owners lists the node's managedFields entries as manager/operation/subresource.
func owners(n *corev1.Node) []string {
	var out []string
	for _, f := range n.ManagedFields {
		out = append(out, f.Manager+"/"+string(f.Operation)+"/"+f.Subresource)
	}
	slices.Sort(out)
	return out
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

// heapProfileEnv names a directory: when set, talos-ccm serves pprof on
// loopback and its heap profile after the initialization is saved there
// (talos-ccm-heap-<nodes>.pprof, for `go tool pprof -sample_index=inuse_space`),
// with a CPU profile from the window's start (talos-ccm-cpu-<nodes>.pprof).
const (
	heapProfileEnv = benchproc.ProfilesEnv
	pprofPort      = 10299
)

func saveProfile(b *testing.B, query, path string) {
	c := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // #nosec G402 -- loopback, self-signed, a profile
	if err := benchproc.SaveProfile(c, fmt.Sprintf("https://127.0.0.1:%d%s", pprofPort, query), path); err != nil {
		b.Log(err)
		return
	}
	b.Logf("profile saved to %s", path)
}

// floorMemory is the floor binary's memory once its package initialization
// is done: what talos-ccm's libraries occupy before it does anything.
func floorMemory(b *testing.B) benchproc.Memory {
	m, err := benchproc.Idle(b.Logf, floor, 2*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkInitialize registers N nodes at once (as kubelets do), N from
// benchproc.Nodes (1000 and 5000; 10000 with `make bench-10k`), whose Talos
// API answers after 20 ms, and measures the time until talos-ccm, with the
// defaults the chart ships, has initialized all of them. talos-ccm reaches
// the Talos API as in a cluster: its talosconfig names the Talos Service
// (talos.default), resolved through the API server to the control planes'
// apid, a process of its own on the same cores that forwards every request
// to the machine it names (forward_test.go); the benchmark fails if a
// request reached a machine any other way. The writes in
// that window (the registrations, talos-ccm's update and status update per
// node) are counted by the API server and priced at its ceiling for the same
// writes issued the same way with nothing else to do (see ceiling): the
// registrations by as many registrants, talos-ccm's writes by as many workers
// as talos-ccm has (--concurrent-node-syncs).
func BenchmarkInitialize(b *testing.B) {
	sizes, err := benchproc.Nodes()
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { initialize(b, n) })
	}
}

// defaultRounds is how many times talos-ccm initializes N new nodes, each
// round followed by a ceiling round of the same writes (benchproc.RoundsEnv
// sets another odd number). The figure is the median of the rounds, each
// against the ceiling measured right after it: pairing cancels the machine's
// drift between rounds, and the median of five does not follow one lucky or
// unlucky round, which the fastest round against the fastest ceiling did (one
// figure at 1,000 nodes varies by ±0.1 here).
const defaultRounds = 5

// nodeName is the name of node i of round r (i < 0: the round's canary).
func nodeName(r, i int) string {
	if i < 0 {
		return fmt.Sprintf("bench-canary-%d", r)
	}
	return fmt.Sprintf("bench-%d-%d", r, i)
}

// round is one batch of N nodes registered at once.
type round struct {
	done    atomic.Int64
	all     chan struct{}
	elapsed time.Duration
	writes  writefloor.Counts
	ceiling writefloor.Ceiling
	// who used the CPU during the round and during its ceiling
	cpu, ceilingCPU *benchproc.Share
}

func initialize(b *testing.B, nodes int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rounds, err := benchproc.Rounds(defaultRounds)
	if err != nil {
		b.Fatal(err)
	}
	base := floorMemory(b)

	ep, err := talosnode.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer ep.Stop()
	// the Talos node behind node i of round r (i < 0: the canary) is number k
	index := func(r, i int) int {
		if i < 0 {
			return rounds*nodes + r
		}
		return r*nodes + i
	}
	// A round's Talos nodes exist during that round only: the simulated Talos
	// API (this process, sharing the cores) holds N nodes in every round, not
	// the nodes of every round at once, whose heap this process's collector
	// marked again and again (with five rounds of 10,000 nodes it used 0.85 ms
	// per node in a round against 0.61 ms in a ceiling round).
	addTalos := func(r int) {
		for i := -1; i < nodes; i++ {
			name, k := nodeName(r, i), index(r, i)
			n, err := ep.AddNode(name, []string{ipOf(k)}, machineSpec(name, k))
			if err != nil {
				b.Fatal(err)
			}
			n.SetLatency(talosLatency)
		}
	}
	removeTalos := func(r int) {
		for i := -1; i < nodes; i++ {
			ep.RemoveNode(nodeName(r, i))
		}
		goruntime.GC() // not left for the next round's collector
	}
	// The talosconfig Talos writes for a talos.dev ServiceAccount: one
	// endpoint, the Talos Service. talos-ccm resolves it through the API
	// server (the Service's EndpointSlices, kept by talosnode.KeepService)
	// to the control planes' apid, which forwards every request to the
	// machine it names (forward_test.go).
	tc := filepath.Join(b.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(tc, "os:reader", talos.ServiceName+"."+talos.ServiceNamespace); err != nil {
		b.Fatal(err)
	}
	listen := apidAddrs(b)
	var apidIPs []net.IP
	for _, a := range listen {
		apidIPs = append(apidIPs, net.IP(netip.MustParseAddrPort(a).Addr().AsSlice()))
	}
	apidCreds := filepath.Join(b.TempDir(), "apid-credentials.json")
	if creds, err := ep.ApidCredentials(apidIPs...); err != nil {
		b.Fatal(err)
	} else if err := creds.WriteFile(apidCreds); err != nil {
		b.Fatal(err)
	}
	args := []string{"--kubeconfig=" + env.KubeconfigPath, "--authentication-kubeconfig=" + env.KubeconfigPath,
		"--authorization-kubeconfig=" + env.KubeconfigPath, "--talosconfig=" + tc, "--leader-elect=false", "--secure-port=0", "--v=1"}
	heapDir := os.Getenv(heapProfileEnv)
	if heapDir != "" {
		// the profile is read anonymously from loopback: allowed on this path only
		args = append(args, "--secure-port="+strconv.Itoa(pprofPort), "--bind-address=127.0.0.1", "--profiling",
			"--authorization-always-allow-paths=/healthz,/debug/pprof/heap,/debug/pprof/profile")
	}

	// watch for initialized nodes from the test side
	rs := make([]*round, rounds)
	for r := range rs {
		rs[r] = &round{all: make(chan struct{})}
	}
	seen := sync.Map{}
	// Protobuf, as talos-ccm's own watch: the API server's watch cache then
	// encodes each event once for both watchers, so the benchmark's observer
	// adds no encoding to the API server's work during the round (its decoding
	// is this process's CPU, a fifth of JSON's).
	factory := informers.NewSharedInformerFactory(kubernetes.NewForConfigOrDie(protobufConfig()), 0)
	inf := factory.Core().V1().Nodes().Informer()
	check := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		var r, i int
		if _, err := fmt.Sscanf(n.Name, "bench-%d-%d", &r, &i); err != nil || r < 0 || r >= rounds {
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
		if _, loaded := seen.LoadOrStore(n.Name, true); !loaded && rs[r].done.Add(1) == int64(nodes) {
			close(rs[r].all)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: check, UpdateFunc: func(_, n any) { check(n) }})
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	register := func(r, i int) {
		if _, err := env.Client.CoreV1().Nodes().Create(ctx, registration(nodeName(r, i), ipOf(index(r, i))), metav1.CreateOptions{}); err != nil {
			b.Error(err)
		}
	}

	// Each round starts talos-ccm afresh, registers N new nodes at once and
	// waits until talos-ccm has initialized all of them. Then talos-ccm
	// stops (it would otherwise sync the ceiling's nodes), the round's nodes
	// are deleted (the API server holds as many nodes in every round) and
	// the API server's ceiling for the same writes is measured.
	var (
		// mem is talos-ccm's memory over its whole life in a round, the
		// highest of the rounds; started, its memory until the canary was
		// initialized (package initialization, start-up, the cache synced)
		mem, started benchproc.Memory
		cpu, self    time.Duration // of talos-ccm and this process, in the rounds
		hop          time.Duration // of the control planes' apid, in the rounds
		// forwarded: what the control planes' apid forwarded in each round
		// (by apid), and what reached the machines through it
		forwarded []string
		viaApid   int64
	)
	workers := app.DefaultConcurrentNodeSyncs
	// The control plane's processes (children of this one), this process
	// (registrants, observer, simulated Talos API) and, during a round,
	// talos-ccm: whom the two cores work for.
	plane := benchproc.Children()
	for _, name := range []string{apiServer, etcd} {
		if plane[name] == 0 {
			b.Logf("no %s process among this process's children: its CPU time is not reported", name)
		}
	}
	pids := map[string]int{apiServer: plane[apiServer], etcd: plane[etcd], benchmark: os.Getpid()}
	b.ResetTimer()
	b.StopTimer()
	for r, rd := range rs {
		addTalos(r)
		// The control planes' apid starts afresh with the round's machines
		// (it holds a connection to each machine it forwarded to), and the
		// Talos Service lists it before talos-ccm starts.
		apidLog, _ := os.Create(filepath.Join(b.TempDir(), fmt.Sprintf("apid-%d.log", r)))
		apidProfile := ""
		if heapDir != "" && r == rounds-1 {
			apidProfile = filepath.Join(heapDir, fmt.Sprintf("apid-cpu-%d.pprof", nodes))
		}
		cp := startApid(b, apid, apidCreds, ep.Addr(), listen, apidLog, apidProfile)
		if err := talosnode.KeepService(ctx, env.Client, cp.addrs...); err != nil {
			cp.stop()
			b.Fatal(err)
		}
		requests0, via0 := ep.Requests(), ep.ViaApid()
		logs, _ := os.Create(filepath.Join(b.TempDir(), fmt.Sprintf("talos-ccm-%d.log", r)))
		proc, err := benchproc.Start(b.Logf, fmt.Sprintf("talos-ccm-%d", r), logs, bin, args...)
		if err != nil {
			b.Fatal(err)
		}
		stop := func() benchproc.Memory { m := proc.Stop(nil, 0); _ = logs.Close(); return m }
		// warm-up: a canary node proves talos-ccm is up and synced (its
		// writes, the status update last, are done before the window opens)
		register(r, -1)
		for deadline := time.Now().Add(2 * time.Minute); ; {
			n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName(r, -1), metav1.GetOptions{})
			if err == nil && n.Spec.ProviderID != "" && len(n.Status.Addresses) > 0 {
				break
			}
			if time.Now().After(deadline) {
				stop()
				b.Fatal("talos-ccm did not initialize the canary node")
			}
			time.Sleep(50 * time.Millisecond)
		}
		started = benchproc.Max(started, proc.Memory())
		last := r == rounds-1
		var cpuProfile chan struct{}
		if heapDir != "" && last {
			cpuProfile = make(chan struct{})
			go func() {
				defer close(cpuProfile)
				saveProfile(b, fmt.Sprintf("/debug/pprof/profile?seconds=%d", 5+nodes/200), filepath.Join(heapDir, fmt.Sprintf("talos-ccm-cpu-%d.pprof", nodes)))
			}()
		}

		window := writefloor.Open(b, env.Client)
		withTalos := maps.Clone(pids)
		withTalos[talosCCM] = proc.Pid()
		withTalos[controlPlaneApid] = cp.pid()
		rd.cpu = benchproc.StartShare(withTalos)
		b.StartTimer()
		start := time.Now()
		parallelDo(nodes, registrants, func(i int) { register(r, i) })
		select {
		case <-rd.all:
		case <-time.After(10 * time.Minute):
			stop()
			b.Fatalf("round %d: only %d/%d nodes initialized", r+1, rd.done.Load(), nodes)
		}
		rd.elapsed = time.Since(start)
		b.StopTimer()
		rd.cpu.Stop()
		rd.writes = window.Close(b)
		cpu += rd.cpu.Used[talosCCM]
		self += rd.cpu.Used[benchmark]
		hop += rd.cpu.Used[controlPlaneApid]
		if cpuProfile != nil {
			<-cpuProfile
		}
		if heapDir != "" && last {
			saveProfile(b, "/debug/pprof/heap?gc=1", filepath.Join(heapDir, fmt.Sprintf("talos-ccm-heap-%d.pprof", nodes)))
		}
		mem = benchproc.Max(mem, stop())
		// The hop was taken: every request the machines received in the
		// round came from the control planes' apid, which forwarded at
		// least one per node (talos-ccm makes three).
		counts := cp.stop()
		_ = apidLog.Close()
		var sum int64
		for _, n := range counts {
			sum += n
		}
		requests, via := ep.Requests()-requests0, ep.ViaApid()-via0
		if sum < int64(nodes) || via != requests {
			b.Fatalf("round %d: the control planes' apid forwarded %d requests (%s) for %d nodes; the machines received %d requests, %d of them forwarded: not every Talos request went through the hop",
				r+1, sum, describeForwarded(counts, cp.addrs), nodes, requests, via)
		}
		forwarded = append(forwarded, describeForwarded(counts, cp.addrs))
		viaApid += via

		// the shapes the ceiling writes: what talos-ccm wrote
		initialized := listRound(b, r, nodes)
		deleteRound(b, r, nodes)
		removeTalos(r)
		rd.ceiling, rd.ceilingCPU = ceiling(b, fmt.Sprintf("ceiling-%d", r), initialized, registrants, workers, pids)
	}

	// The figure is the median round against its own ceiling (the one
	// measured right after it). The fastest round against the fastest
	// ceiling, the figure until 2026-11-27, is printed beside it.
	type pair struct {
		rd    *round
		ratio float64
	}
	pairs := make([]pair, rounds)
	times, ceilings := make([]string, rounds), make([]writefloor.Ceiling, rounds)
	fastest := rs[0]
	for r, rd := range rs {
		own := writefloor.Floor{Writes: rd.writes, Ceilings: []writefloor.Ceiling{rd.ceiling}, Objects: nodes}.Duration()
		pairs[r] = pair{rd, rd.elapsed.Seconds() / own.Seconds()}
		times[r] = fmt.Sprintf("%s (ceiling %.0f writes/s; %.2fx)", rd.elapsed.Round(time.Millisecond), rd.ceiling.Rate(), pairs[r].ratio)
		ceilings[r] = rd.ceiling
		if rd.elapsed < fastest.elapsed {
			fastest = rd
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int { return cmp.Compare(a.ratio, b.ratio) })
	median := pairs[rounds/2].rd
	bestOfEach := fastest.elapsed.Seconds() / writefloor.Floor{Writes: fastest.writes, Ceilings: writefloor.Best(ceilings...), Objects: nodes}.Duration().Seconds()
	b.ReportMetric(bestOfEach, "init-fastest-x-fastest-floor")
	b.Logf("rounds, each against the ceiling measured right after it: %s; the range %.2f - %.2fx; the fastest round against the fastest ceiling %.2fx",
		strings.Join(times, ", "), pairs[0].ratio, pairs[rounds-1].ratio, bestOfEach)
	apiFloor := writefloor.Floor{Writes: median.writes, Ceilings: []writefloor.Ceiling{median.ceiling}, Objects: nodes}
	b.ReportMetric(cpu.Seconds()/float64(rounds), "talos-ccm-cpu-s")
	b.ReportMetric(float64(viaApid)/float64(rounds*(nodes+1)), "forwarded-per-node")
	b.ReportMetric(mem.Anon, "talos-ccm-anon-MiB")
	b.ReportMetric(mem.Heap, "talos-ccm-heap-MiB")
	b.ReportMetric(mem.HeapLive, "talos-ccm-heap-live-MiB")
	if mem.WorkingSetMeasured {
		b.ReportMetric(mem.WorkingSet, "talos-ccm-working-set-MiB")
	}
	b.ReportMetric(started.Anon, "talos-ccm-start-anon-MiB")
	b.ReportMetric(base.Anon, "framework-floor-anon-MiB")
	b.Logf("%d nodes registered at once (%d registrants, 20 ms Talos latency), talos-ccm with %d workers, the median of %d rounds: %s",
		nodes, registrants, workers, rounds, apiFloor.Report(b, "init", median.elapsed))
	b.Logf("talos-ccm memory, peaks of the %d rounds: %s; %.1f MiB anonymous above the %.1f MiB of a process that only links k8s.io/cloud-provider/app and the Talos machinery client (%s); Talos requests %d",
		rounds, mem, mem.Anon-base.Anon, base.Anon, base, ep.Requests())
	b.Logf("talos-ccm memory until started and synced (package initialization, start-up, the canary node): %s", started)
	b.Logf("Talos API through the Talos Service: the control planes' apid at %s forwarded, by round: %s; the machines received %d requests in the rounds, every one forwarded (%.2f per node, the canaries included)",
		strings.Join(listen, ", "), strings.Join(forwarded, "; "), viaApid, float64(viaApid)/float64(rounds*(nodes+1)))
	b.Logf("CPU time in the %d rounds: talos-ccm %.2f s (%.2f ms per node); the control planes' apid (the forwarding hop) %.2f s (%.2f ms per node); the benchmark's process (registrants, watch, simulated Talos machines) %.2f s",
		rounds, cpu.Seconds(), float64(cpu.Microseconds())/1000/float64(rounds*nodes), hop.Seconds(), float64(hop.Microseconds())/1000/float64(rounds*nodes), self.Seconds())
	var during, ceilingCPU []*benchproc.Share
	for _, rd := range rs {
		during, ceilingCPU = append(during, rd.cpu), append(ceilingCPU, rd.ceilingCPU)
	}
	// Machine speed drifts between rounds; one process's CPU time against
	// another's measured in the same rounds does not.
	perAPI := "talos-ccm's CPU per ms of kube-apiserver's: not measured"
	api, talos := benchproc.PerObject(during, apiServer, nodes), benchproc.PerObject(during, talosCCM, nodes)
	if api > 0 && talos > 0 {
		b.ReportMetric(talos/api, "talos-ccm-cpu-per-apiserver-cpu")
		perAPI = fmt.Sprintf("talos-ccm used %.2f ms for each ms of kube-apiserver's", talos/api)
	}
	b.Logf("CPU per node, median of the rounds: while talos-ccm initialized: %s; in the ceiling rounds (the same writes, no talos-ccm): %s; %s",
		benchproc.Describe(during, []string{apiServer, etcd, talosCCM, controlPlaneApid, benchmark}, nodes),
		benchproc.Describe(ceilingCPU, []string{apiServer, etcd, benchmark}, nodes), perAPI)
}

// The processes whose CPU time the benchmark reports.
const (
	apiServer = "kube-apiserver"
	etcd      = "etcd"
	talosCCM  = "talos-ccm"
	benchmark = "benchmark"
	// controlPlaneApid is the control planes' apid (the forwarding hop).
	controlPlaneApid = "apid"
)

// listRound returns round r's nodes as the API server holds them.
func listRound(b *testing.B, r, nodes int) []corev1.Node {
	out := make([]corev1.Node, nodes)
	list, err := env.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range list.Items {
		var rr, i int
		if _, err := fmt.Sscanf(n.Name, "bench-%d-%d", &rr, &i); err == nil && rr == r && i >= 0 && i < nodes {
			out[i] = n
		}
	}
	return out
}

// deleteRound deletes round r's nodes and its canary and waits until the API
// server holds none of the round's nodes.
func deleteRound(b *testing.B, r, nodes int) {
	ctx := context.Background()
	parallelDo(nodes+1, registrants, func(i int) { _ = env.Client.CoreV1().Nodes().Delete(ctx, nodeName(r, i-1), metav1.DeleteOptions{}) })
	for deadline := time.Now().Add(5 * time.Minute); ; {
		list, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		left := 0
		for _, n := range list.Items {
			if strings.HasPrefix(n.Name, fmt.Sprintf("bench-%d-", r)) {
				left++
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("round %d: %d nodes not deleted", r+1, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
