package integration

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// decisionClock records, per CSR name, when a kubelet called Create (client
// side, just before the call) and when a watch of the CSRs first saw a
// decision (Approved or Denied). A CSR's creationTimestamp has a resolution of
// one second, too coarse for these figures.
type decisionClock struct {
	mu        sync.Mutex
	submitted map[string]time.Time
	decided   map[string]time.Time
	how       map[string]*certificatesv1.CertificateSigningRequestCondition
}

// watchDecisions starts an informer on the test's CSRs that records decisions
// until the test ends.
func watchDecisions(b testing.TB) *decisionClock {
	b.Helper()
	d := &decisionClock{submitted: map[string]time.Time{}, decided: map[string]time.Time{}, how: map[string]*certificatesv1.CertificateSigningRequestCondition{}}
	factory := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = testLabel + "=" + caseLabel(b)
	}))
	seen := func(obj any) {
		now := time.Now()
		c, ok := obj.(*certificatesv1.CertificateSigningRequest)
		if !ok {
			return
		}
		cond := decided(c)
		if cond == nil {
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if _, done := d.decided[c.Name]; !done {
			d.decided[c.Name], d.how[c.Name] = now, cond.DeepCopy()
		}
	}
	inf := factory.Certificates().V1().CertificateSigningRequests().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }}); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	b.Cleanup(func() { cancel(); factory.Shutdown() })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("CSR watch did not sync")
	}
	return d
}

// submit records the time and creates the CSR.
func (d *decisionClock) submit(ctx context.Context, kubelet kubernetes.Interface, obj *certificatesv1.CertificateSigningRequest) error {
	d.mu.Lock()
	d.submitted[obj.Name] = time.Now()
	d.mu.Unlock()
	_, err := kubelet.CertificatesV1().CertificateSigningRequests().Create(ctx, obj, metav1.CreateOptions{})
	return err
}

// count is the number of names decided.
func (d *decisionClock) count(names []string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, name := range names {
		if _, ok := d.decided[name]; ok {
			n++
		}
	}
	return n
}

// latencies are submission → decision of names, sorted, and the conditions.
func (d *decisionClock) latencies(names []string) ([]time.Duration, []*certificatesv1.CertificateSigningRequestCondition) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []time.Duration
	var conds []*certificatesv1.CertificateSigningRequestCondition
	for _, name := range names {
		at, ok := d.decided[name]
		if !ok {
			continue
		}
		out = append(out, max(0, at.Sub(d.submitted[name])))
		conds = append(conds, d.how[name])
	}
	slices.Sort(out)
	return out, conds
}

// countEvents counts the CSRs among names with at least one event of reason.
func countEvents(b testing.TB, reason string, names []string) int {
	b.Helper()
	evs, err := env.Client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{FieldSelector: "reason=" + reason + ",involvedObject.kind=CertificateSigningRequest"})
	if err != nil {
		b.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range evs.Items {
		if slices.Contains(names, e.InvolvedObject.Name) {
			seen[e.InvolvedObject.Name] = true
		}
	}
	return len(seen)
}

// quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func latencySummary(sorted []time.Duration) string {
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("p50 %s p95 %s p99 %s max %s", r(quantile(sorted, .50)), r(quantile(sorted, .95)), r(quantile(sorted, .99)), r(quantile(sorted, 1)))
}

// BenchmarkRenewalStorm: 1000 initialized honest nodes and 50 initialized
// hostile nodes whose Talos API hangs (it accepts every request and never
// answers) all submit a kubelet-serving CSR at once. The controller runs as
// talos-ccm runs it: the chart's defaults (--csr-workers=4, --talos-timeout=10s,
// --talos-lookup-timeout twice that), talos-ccm's facts source reading every
// node's simulated Talos API (real client, mTLS) with nothing remembered (as
// after a restart, the worst case: each honest node costs one lookup). For
// each honest CSR it reports the time from the kubelet's Create call to the
// watch seeing the decision (p50/p95/p99/max), against a baseline in the same
// run: the same 1000 nodes renewing without the hostile ones (a fresh
// talos-ccm too). The hostile CSRs must never be approved; what became of
// them is reported.
//
//	KUBEBUILDER_ASSETS=$(hack/control-plane.sh) go test -run '^$' -bench RenewalStorm -benchtime 1x ./ccm/csr/integration
func BenchmarkRenewalStorm(b *testing.B) {
	setup(b)
	cleanupCSRs(b)
	const (
		honestN      = 1000
		hostileN     = 50
		submitters   = 32
		talosTimeout = 10 * time.Second // the chart's talos.timeout
	)
	ctx := context.Background()
	ep := talosnode.StartFor(b)
	client, err := ep.NewClient(b.TempDir(), talos.Options{Timeout: talosTimeout})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Close() })

	type kubelet struct {
		name, ip string
		client   kubernetes.Interface
		request  []byte
		hostile  *talosnode.Node
	}
	var honest, hostile []*kubelet
	for i := range honestN {
		name := fmt.Sprintf("storm-%04d", i)
		honest = append(honest, &kubelet{name: name, ip: fmt.Sprintf("10.90.%d.%d", i/250, i%250+1)})
	}
	for i := range hostileN {
		name := fmt.Sprintf("storm-hung-%02d", i)
		hostile = append(hostile, &kubelet{name: name, ip: fmt.Sprintf("10.91.0.%d", i+1)})
	}
	all := append(slices.Clone(honest), hostile...)
	for _, k := range all {
		n, err := ep.AddNode(k.name, []string{k.ip}, metalSpec(k.name, k.ip))
		if err != nil {
			b.Fatal(err)
		}
		if slices.Contains(hostile, k) {
			n.Hold()
			b.Cleanup(n.Release)
			k.hostile = n
		}
		k.client = impersonating(b, k.name)
		k.request = csrtest.Request{NodeName: k.name, DNSNames: []string{k.name}, IPs: csrtest.Addrs(k.ip)}.MustPEM()
	}
	b.Cleanup(func() {
		_ = env.Client.CoreV1().Nodes().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: testLabel + "=" + caseLabel(b)})
	})
	parallel(b, len(all), submitters, func(i int) error {
		_, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: all[i].name, Labels: map[string]string{testLabel: caseLabel(b)},
				Annotations: map[string]string{"alpha.kubernetes.io/provided-node-ip": all[i].ip}},
			Spec: corev1.NodeSpec{ProviderID: "talos://metal/" + all[i].name},
		}, metav1.CreateOptions{})
		return err
	})
	clock := watchDecisions(b)
	opts := csr.NewOptions()

	// storm runs a fresh talos-ccm (nothing remembered) while the kubelets
	// submit at once, and returns when every honest CSR is decided.
	type phase struct {
		honest, hostile []string
		elapsed         time.Duration
		stop            func()
		start           time.Time
	}
	storm := func(iter int, suffix string, who []*kubelet) *phase {
		p := &phase{}
		src := facts.NewSource(client, cloud.NewInterpreter(nil), facts.Options{LookupTimeout: 2 * talosTimeout})
		p.stop = startController(b, approver, opts, src)
		// spread the hostile kubelets evenly through the submission order
		order := slices.Clone(who[:min(len(who), honestN)])
		if len(who) > honestN {
			step := honestN / hostileN
			for j, k := range who[honestN:] {
				pos := j*(step+1) + step/2
				order = slices.Insert(order, min(pos, len(order)), k)
			}
		}
		names := make([]string, len(order))
		for i, k := range order {
			names[i] = fmt.Sprintf("%s-%d%s", k.name, iter, suffix)
			if k.hostile != nil {
				p.hostile = append(p.hostile, names[i])
			} else {
				p.honest = append(p.honest, names[i])
			}
		}
		p.start = time.Now()
		parallel(b, len(order), submitters, func(i int) error {
			return clock.submit(ctx, order[i].client, benchCSR(b, names[i], order[i].request))
		})
		if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 15*time.Minute, true, func(context.Context) (bool, error) {
			return clock.count(p.honest) == len(p.honest), nil
		}); err != nil {
			b.Fatalf("%s: %d of %d honest CSRs decided", suffix, clock.count(p.honest), len(p.honest))
		}
		p.elapsed = time.Since(p.start)
		return p
	}
	approvedAll := func(label string, names []string) []time.Duration {
		lat, conds := clock.latencies(names)
		for i, c := range conds {
			if c.Type != certificatesv1.CertificateApproved || c.Reason != csr.ReasonNodeIdentityVerified {
				b.Fatalf("%s: an honest CSR was decided %s/%s: %s", label, c.Type, c.Reason, conds[i].Message)
			}
		}
		return lat
	}

	for iter := range b.N {
		b.StopTimer()
		base := storm(iter, "-base", honest)
		base.stop()
		baseLat := approvedAll("baseline", base.honest)

		retriedBefore := decisions(b, "retry", csr.ReasonAddressLookupFailed)
		b.StartTimer()
		st := storm(iter, "-storm", all)
		b.StopTimer()
		stormLat := approvedAll("storm", st.honest)

		// the hostile nodes when the last honest CSR was decided
		var held, calls int64
		for _, k := range hostile {
			held += k.hostile.Held()
			calls += k.hostile.Calls()
		}
		decidedHostile := clock.count(st.hostile)
		// ... and once each of their lookups has run out (--talos-timeout per
		// request): every hostile CSR is postponed, none decided
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
			return decisions(b, "retry", csr.ReasonAddressLookupFailed) >= retriedBefore+hostileN, nil
		}); err != nil {
			b.Fatalf("the hostile CSRs were not postponed (AddressLookupFailed): %v more retries", decisions(b, "retry", csr.ReasonAddressLookupFailed)-retriedBefore)
		}
		postponedAfter := time.Since(st.start)
		// each with a Warning event on the CSR saying why (events are written
		// behind the decisions: wait until every one is)
		var postponedEvents int
		_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			postponedEvents = countEvents(b, csr.EventReasonPostponed, st.hostile)
			return postponedEvents >= hostileN, nil
		})
		for _, name := range st.hostile {
			c, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if cond := decided(c); cond != nil && cond.Type == certificatesv1.CertificateApproved {
				b.Fatalf("%s approved although its node's Talos API never answered: %+v", name, cond)
			}
		}
		hostileLat, hostileConds := clock.latencies(st.hostile)
		denied := 0
		for _, c := range hostileConds {
			if c.Type == certificatesv1.CertificateDenied {
				denied++
			}
		}
		st.stop()

		p99 := quantile(stormLat, .99).Seconds() / quantile(baseLat, .99).Seconds()
		b.ReportMetric(quantile(baseLat, .99).Seconds(), "s-p99-baseline")
		b.ReportMetric(quantile(stormLat, .99).Seconds(), "s-p99-storm")
		b.ReportMetric(p99, "x-p99-of-baseline")
		fmt.Printf("node-csr-approval renewal storm (%d workers, talos-timeout %s, lookup timeout %s, nothing remembered), %d honest CSRs, Create call → decision seen by a watch:\n",
			opts.Workers, talosTimeout, 2*talosTimeout, honestN)
		fmt.Printf("  baseline (no hostile nodes): %s; all decided after %s\n", latencySummary(baseLat), base.elapsed.Round(time.Millisecond))
		fmt.Printf("  beside %d hung nodes' CSRs: %s; all decided after %s\n", hostileN, latencySummary(stormLat), st.elapsed.Round(time.Millisecond))
		fmt.Printf("  ratio storm/baseline: p50 %.2fx p95 %.2fx p99 %.2fx max %.2fx\n",
			quantile(stormLat, .5).Seconds()/quantile(baseLat, .5).Seconds(), quantile(stormLat, .95).Seconds()/quantile(baseLat, .95).Seconds(),
			p99, quantile(stormLat, 1).Seconds()/quantile(baseLat, 1).Seconds())
		fmt.Printf("  hung nodes when the last honest CSR was decided: %d of %d CSRs decided, %d Talos requests held in flight (%d made); all %d postponed (AddressLookupFailed, pending) %s after the storm began, %d of them with a %s event; approved: 0, denied: %d",
			decidedHostile, hostileN, held, calls, hostileN, postponedAfter.Round(time.Millisecond), postponedEvents, csr.EventReasonPostponed, denied)
		if len(hostileLat) > 0 {
			fmt.Printf(" (decided after %s)", latencySummary(hostileLat))
		}
		fmt.Println()
	}
}
