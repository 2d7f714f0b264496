package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/events"
	"github.com/hybrid-ccm/hybrid-ccm/test/benchproc"
	"github.com/hybrid-ccm/hybrid-ccm/test/writefloor"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// BenchmarkDecide measures how long the controller (default options, events
// on) takes to approve n kubelet-serving CSRs of n initialized nodes, n from
// benchproc.Nodes (1000 and 5000; 10000 with `make bench-10k`): once with all
// n pending when it starts ("queued", the primary figure), once submitted at
// once by n kubelets while it runs ("live", which includes the submission).
//
// Each figure is compared to its floor (test/writefloor): the writes the API
// server served meanwhile (the approvals, the events recorded so far, in "live"
// the submissions), priced at the API server's ceiling for the same writes
// issued the same way with nothing else to do (csrCeilings: UpdateApproval by
// as many workers as the controller has, on objects already in hand, each
// followed by the same two events from as many writers as its event sink has;
// in "live" after the submissions by as many submitters), measured in the same
// run before and after the figures (the faster of the two rounds).
//
//	KUBEBUILDER_ASSETS=$(hack/control-plane.sh) go test -run '^$' -bench Decide -benchtime 1x ./ccm/csr/integration
func BenchmarkDecide(b *testing.B) {
	setup(b)
	sizes, err := benchproc.Nodes()
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("csrs=%d", n), func(b *testing.B) {
			cleanupCSRs(b)
			decide(b, n)
		})
	}
}

func decide(b *testing.B, n int) {
	const submitters = 16
	ctx := context.Background()
	opts := csr.NewOptions()

	for iter := range b.N {
		b.StopTimer()
		prefix := fmt.Sprintf("bench%d-n%d", iter, n) // events of an earlier size are not counted
		names := make([]string, n)
		addrs := csrtest.NewAddresses()
		for i := range names {
			names[i] = fmt.Sprintf("%s-%04d", prefix, i)
			addrs.Set(names[i], csrtest.InternalIP(fmt.Sprintf("10.%d.%d.%d", 100+iter%100, i/250, i%250+1)), csrtest.Hostname(names[i]))
		}
		nodes := make([]*corev1.Node, n)
		parallel(b, n, submitters, func(i int) (err error) {
			nodes[i], err = env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{testLabel: caseLabel(b)}},
				Spec:       corev1.NodeSpec{ProviderID: "talos://metal/" + names[i]},
			}, metav1.CreateOptions{})
			return err
		})
		b.Cleanup(func() {
			_ = env.Client.CoreV1().Nodes().DeleteCollection(context.Background(), metav1.DeleteOptions{},
				metav1.ListOptions{LabelSelector: testLabel + "=" + caseLabel(b)})
		})
		kubelets := make([]kubernetes.Interface, n)
		bare, queued, live := make([][]byte, n), make([][]byte, n), make([][]byte, n)
		for i, name := range names {
			kubelets[i] = impersonating(b, name)
			f, _ := addrs.Established(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			r := csrtest.Request{NodeName: name, DNSNames: []string{name}, IPs: csrtest.Addrs(f.Addresses[0].Address)}
			bare[i], queued[i], live[i] = r.MustPEM(), r.MustPEM(), r.MustPEM()
		}

		// the ceilings before the figures (and after them, below)
		queuedBefore, liveBefore := csrCeilings(b, nodes, bare, kubelets, "-ceiling-a", submitters, opts.Workers)

		// Queued: 1000 pending CSRs exist when the controller starts (cold start:
		// informer lists, cache sync, workers, approvals).
		parallel(b, n, submitters, func(i int) error {
			_, err := kubelets[i].CertificatesV1().CertificateSigningRequests().Create(ctx, benchCSR(b, names[i]+"-queued", queued[i]), metav1.CreateOptions{})
			return err
		})
		approvedBefore := decisions(b, "approve", csr.ReasonNodeIdentityVerified)
		both := writefloor.Open(b, env.Client) // both bursts, until the events are written
		window := writefloor.Open(b, env.Client)
		b.StartTimer()
		start := time.Now()
		stop := startController(b, approver, opts, addrs)
		waitApproved(b, approvedBefore+float64(n))
		queuedDur := time.Since(start)
		b.StopTimer()
		queuedFloor := writefloor.Floor{Writes: window.Close(b), Objects: n}

		// Live: the controller is running; 1000 kubelets submit at once (16 parallel
		// submitters); the clock runs from the first submission to the last decision.
		approvedBefore = decisions(b, "approve", csr.ReasonNodeIdentityVerified)
		window = writefloor.Open(b, env.Client)
		start = time.Now()
		parallel(b, n, submitters, func(i int) error {
			_, err := kubelets[i].CertificatesV1().CertificateSigningRequests().Create(ctx, benchCSR(b, names[i]+"-live", live[i]), metav1.CreateOptions{})
			return err
		})
		submitted := time.Since(start)
		waitApproved(b, approvedBefore+float64(n))
		liveDur := time.Since(start)
		liveFloor := writefloor.Floor{Writes: window.Close(b), Objects: n}

		list, err := env.Client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{LabelSelector: testLabel + "=" + caseLabel(b)})
		if err != nil {
			b.Fatal(err)
		}
		approved := 0
		for i := range list.Items {
			if strings.Contains(list.Items[i].Name, "-ceiling-") {
				continue // approved by the ceiling's bare updates
			}
			if c := decided(&list.Items[i]); c != nil && c.Type == certificatesv1.CertificateApproved && c.Reason == csr.ReasonNodeIdentityVerified {
				approved++
			}
		}
		if approved != 2*n {
			b.Fatalf("%d of %d controller CSRs approved", approved, 2*n)
		}
		events := settledEventCount(b, prefix)
		settled := both.Close(b)
		perDecision := (settled[approveWrite] + settled[eventWrite]) / float64(2*n)
		b.ReportMetric(perDecision, "writes/decision")
		stop() // it would decide the ceiling's requests
		queuedAfter, liveAfter := csrCeilings(b, nodes, bare, kubelets, "-ceiling-b", submitters, opts.Workers)
		queuedFloor.Ceilings = writefloor.Best(queuedBefore, queuedAfter)
		liveFloor.Ceilings = writefloor.Best(liveBefore, liveAfter)
		fmt.Printf("node-csr-approval (%d workers, events on), %d queued CSRs, controller start to all decided: %s\n",
			opts.Workers, n, queuedFloor.Report(b, "queued", queuedDur))
		fmt.Printf("node-csr-approval (%d workers, events on), %d CSRs submitted at once by %d submitters while it runs (submission %s) to all decided: %s\n",
			opts.Workers, n, submitters, submitted.Round(time.Millisecond), liveFloor.Report(b, "live", liveDur))
		fmt.Printf("node-csr-approval: events recorded once settled: %d of %d (one on the CSR, one on the Node per decision, both bursts); the controller's writes per decision then: %.2f (%.0f approvals, %.0f events for %d decisions); the events written after a figure's last decision are not in its floor\n",
			events, 4*n, perDecision, settled[approveWrite], settled[eventWrite], 2*n)
	}
}

// Kinds of write of a CSR's approval: the kubelet's submission, the
// controller's approval and its events (one on the CSR, one on the Node).
var (
	submitWrite  = writefloor.Kind{Verb: "POST", Resource: "certificatesigningrequests"}
	approveWrite = writefloor.Kind{Verb: "PUT", Resource: "certificatesigningrequests", Subresource: "approval"}
	eventWrite   = writefloor.Kind{Verb: "POST", Resource: "events"}
)

// csrCeilings measures the API server's ceilings for the writes of approvals
// issued as the two figures issue them, on requests named after the nodes with
// suffix (no controller may be running): "queued", 1000 pending requests
// approved by as many workers as the controller has, each approval followed by
// its two events, written by as many writers as the controller's event sink
// has; "live", the same after the submissions by as many submitters. As in the
// figures, the clock stops at the last approval, and the events written by then
// count.
func csrCeilings(b *testing.B, nodes []*corev1.Node, requests [][]byte, kubelets []kubernetes.Interface, suffix string, submitters, workers int) (queued, live writefloor.Ceiling) {
	b.Helper()
	ctx := context.Background()
	n := len(nodes)
	measure := func(name string, submitted bool) writefloor.Ceiling {
		pending := make([]*certificatesv1.CertificateSigningRequest, n)
		submit := writefloor.Stage{Kinds: []writefloor.Kind{submitWrite}, Workers: submitters, Write: func(i int) (err error) {
			pending[i], err = kubelets[i].CertificatesV1().CertificateSigningRequests().Create(ctx, benchCSR(b, nodes[i].Name+suffix+name, requests[i]), metav1.CreateOptions{})
			return err
		}}
		approve := writefloor.Stage{Kinds: []writefloor.Kind{approveWrite}, Workers: workers, Write: func(i int) error {
			c := pending[i].DeepCopy()
			c.Status.Conditions = append(c.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
				Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: csr.ReasonNodeIdentityVerified,
				Message: fmt.Sprintf("requested by node %q for DNS %s", nodes[i].Name, nodes[i].Name), LastUpdateTime: metav1.Now(),
			})
			_, err := approver.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, c.Name, c, metav1.UpdateOptions{})
			return err
		}}
		// events as client-go's recorder writes them (cluster-scoped objects:
		// in "default"), under a reason of their own so that they are not
		// counted as the controller's
		eventsAPI := approver.CoreV1().Events(metav1.NamespaceDefault)
		emit := func(obj corev1.ObjectReference, message string) error {
			now := metav1.Now()
			_, err := eventsAPI.Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", obj.Name, now.UnixNano()), Namespace: metav1.NamespaceDefault},
				InvolvedObject: obj, Reason: "BenchCeiling", Message: message, Type: corev1.EventTypeNormal,
				Source: corev1.EventSource{Component: names.CSRApprovalController}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
			}, metav1.CreateOptions{})
			return err
		}
		record := writefloor.Stage{Kinds: []writefloor.Kind{eventWrite, eventWrite}, Workers: events.Workers, Trailing: true, Write: func(i int) error {
			c := pending[i]
			msg := fmt.Sprintf("Approved kubelet serving certificate request of %s (%s): requested by node %q for DNS %s", c.Spec.Username, csr.ReasonNodeIdentityVerified, nodes[i].Name, nodes[i].Name)
			if err := emit(corev1.ObjectReference{Kind: "CertificateSigningRequest", APIVersion: "certificates.k8s.io/v1", Name: c.Name, UID: c.UID}, msg); err != nil {
				return err
			}
			return emit(corev1.ObjectReference{Kind: "Node", Name: nodes[i].Name, UID: nodes[i].UID}, msg)
		}}
		if submitted {
			return writefloor.MeasureStages(b, n, submit, approve, record)
		}
		parallel(b, n, submitters, submit.Write)
		return writefloor.MeasureStages(b, n, approve, record)
	}
	return measure("-queued", false), measure("-live", true)
}

// settledEventCount counts the CSRApproved events about this iteration's objects once
// their number stops growing. Events are best effort: client-go's broadcaster drops
// what its sink cannot write fast enough (see docs/csr-approval.md).
func settledEventCount(b *testing.B, prefix string) int {
	b.Helper()
	count := func() int {
		evs, err := env.Client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{FieldSelector: "reason=" + csr.EventReasonApproved})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, e := range evs.Items {
			if strings.HasPrefix(e.InvolvedObject.Name, prefix+"-") {
				n++
			}
		}
		return n
	}
	last := -1
	for n := count(); n != last; n = count() {
		last = n
		time.Sleep(time.Second)
	}
	return last
}

// waitApproved polls the controller's metric until it counts want approvals.
func waitApproved(b *testing.B, want float64) {
	b.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
		return decisions(b, "approve", csr.ReasonNodeIdentityVerified) >= want, nil
	}); err != nil {
		b.Fatalf("approvals did not reach %v: %v", want, err)
	}
}

func benchCSR(b *testing.B, name string, request []byte) *certificatesv1.CertificateSigningRequest {
	c := csrtest.Object(name, request)
	c.Labels = map[string]string{testLabel: caseLabel(b)}
	return c
}

// parallel runs f(0..n-1) on workers goroutines and fails b on the first error.
func parallel(b *testing.B, n, workers int, f func(i int) error) {
	b.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan int)
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		b.Fatalf("%d of %d calls failed, first: %v", len(errs), n, errs[0])
	}
}

// BenchmarkHostileNode measures whether a hostile node delays other nodes'
// certificates: 200 initialized nodes submit a serving CSR each, decided by the
// controller (default options) with talos-ccm's real facts source reading each
// node's simulated Talos API once (real client, mTLS). Baseline first; then, in
// the same run, 200 other nodes do the same while a node whose Talos API hangs
// (requests held by the endpoint for the whole run) has 4 CSRs per worker
// pending, and a node listing 20 addresses in provided-node-ip has as many.
//
//	KUBEBUILDER_ASSETS=... go test -run '^$' -bench HostileNode -benchtime 1x ./ccm/csr/integration
func BenchmarkHostileNode(b *testing.B) {
	setup(b)
	cleanupCSRs(b)
	const (
		n          = 200
		submitters = 16
		perLookup  = 3
	)
	ctx := context.Background()
	opts := csr.NewOptions()
	s := startHostile(b)
	startController(b, approver, opts, s.facts)
	hostileN := 4 * opts.Workers

	for iter := range b.N {
		b.StopTimer()
		// honest nodes: one set for the baseline, one beside the hostile nodes
		phase := func(set int) (names []string, reqs [][]byte) {
			for i := range n {
				name := fmt.Sprintf("bh%d-%d-%03d", iter, set, i)
				ip := fmt.Sprintf("10.%d.%d.%d", 83+set, 100+iter%100, i+1)
				if _, err := s.ep.AddNode(name, []string{ip}, metalSpec(name, ip)); err != nil {
					b.Fatal(err)
				}
				names = append(names, name)
				reqs = append(reqs, csrtest.Request{NodeName: name, DNSNames: []string{name}, IPs: csrtest.Addrs(ip)}.MustPEM())
			}
			parallel(b, n, submitters, func(i int) error {
				_, err := env.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
					ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{testLabel: caseLabel(b)},
						Annotations: map[string]string{"alpha.kubernetes.io/provided-node-ip": fmt.Sprintf("10.%d.%d.%d", 83+set, 100+iter%100, i+1)}},
					Spec: corev1.NodeSpec{ProviderID: "talos://metal/" + names[i]},
				}, metav1.CreateOptions{})
				return err
			})
			return names, reqs
		}
		baseNames, baseReqs := phase(0)
		hostNames, hostReqs := phase(1)
		b.Cleanup(func() {
			_ = env.Client.CoreV1().Nodes().DeleteCollection(context.Background(), metav1.DeleteOptions{},
				metav1.ListOptions{LabelSelector: testLabel + "=" + caseLabel(b)})
		})
		decideAll := func(names []string, reqs [][]byte, suffix string) time.Duration {
			before := decisions(b, "approve", csr.ReasonNodeIdentityVerified)
			start := time.Now()
			parallel(b, n, submitters, func(i int) error {
				_, err := impersonating(b, names[i]).CertificatesV1().CertificateSigningRequests().Create(ctx, benchCSR(b, names[i]+suffix, reqs[i]), metav1.CreateOptions{})
				return err
			})
			waitApproved(b, before+n)
			return time.Since(start)
		}

		b.StartTimer()
		base := decideAll(baseNames, baseReqs, "")
		b.StopTimer()

		// the hostile nodes ask first, and their lookups are in flight
		deniedBefore := decisions(b, "deny", csr.ReasonProvidedNodeIPInvalid)
		hung := csrtest.Request{NodeName: hungNode, DNSNames: []string{hungNode}, IPs: csrtest.Addrs(hungIP)}.MustPEM()
		many := csrtest.Request{NodeName: manyIPsNode, IPs: csrtest.Addrs("10.82.1.1")}.MustPEM()
		parallel(b, hostileN, submitters, func(i int) error {
			if _, err := impersonating(b, hungNode).CertificatesV1().CertificateSigningRequests().Create(ctx, benchCSR(b, fmt.Sprintf("bh%d-hung-%d", iter, i), hung), metav1.CreateOptions{}); err != nil {
				return err
			}
			_, err := impersonating(b, manyIPsNode).CertificatesV1().CertificateSigningRequests().Create(ctx, benchCSR(b, fmt.Sprintf("bh%d-many-%d", iter, i), many), metav1.CreateOptions{})
			return err
		})
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return s.hung.Held() >= perLookup, nil
		}); err != nil {
			b.Fatal("the hung node's lookup never reached its Talos API")
		}
		b.StartTimer()
		hostile := decideAll(hostNames, hostReqs, "")
		b.StopTimer()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return decisions(b, "deny", csr.ReasonProvidedNodeIPInvalid) >= deniedBefore+float64(hostileN), nil
		}); err != nil {
			b.Fatal("the many-address node's CSRs were not denied")
		}
		held := s.hung.Held()
		if held != perLookup {
			b.Fatalf("hung node: %d Talos requests in flight, want one lookup (%d)", held, perLookup)
		}
		b.ReportMetric(base.Seconds(), "s-baseline-decided")
		b.ReportMetric(hostile.Seconds(), "s-with-hostile-decided")
		b.ReportMetric(hostile.Seconds()/base.Seconds(), "x-of-baseline")
		fmt.Printf("node-csr-approval (%d workers) with a hostile node: %d CSRs of other nodes, each read from its Talos API, submission to all approved: baseline %s | while a node whose Talos API hangs has %d CSRs pending and a node listing %d addresses has %d: %s (%.2fx baseline) | hung node: %d Talos requests in flight (one lookup, beside the workers), many-address node: %d dials, %d denied\n",
			opts.Workers, n, base.Round(time.Millisecond), hostileN, manyIPs, hostileN, hostile.Round(time.Millisecond), hostile.Seconds()/base.Seconds(),
			held, s.manyIPs.Calls(), hostileN)
	}
}
