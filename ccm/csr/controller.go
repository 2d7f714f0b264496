package csr

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certificatesinformers "k8s.io/client-go/informers/certificates/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	certificateslisters "k8s.io/client-go/listers/certificates/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/controlloop"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/events"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// NodeFacts tells what talos-ccm itself established for a node from the node's
// Talos API (ccm/facts.Source): the controller takes the facts' Addresses as the
// only proof for IP SANs and for DNS names other than the node name. The
// kubelet-written provided-node-ip annotation and the node's own
// status.addresses are NOT proof: a kubelet writes both itself.
//
// The answer is only proof because it is bound to the node: the source
// believes only a Talos machine that names itself as node.Name (its Talos
// nodename), since the address it dials usually comes from the kubelet-written
// annotation, and a kubelet that points it at another machine would otherwise
// get that machine's addresses "established" for itself.
//
// Implementations must not modify node (it is the shared informer copy) and
// return an error, not empty facts, when they cannot tell: an error makes the
// controller retry, no addresses make it deny every IP SAN. An error wrapping
// facts.ErrIdentity (the machine that answered is provably another node) makes
// it deny the request (NodeIdentityMismatch): waiting does not change who
// answers there, and a genuine kubelet submits a new request later. One
// wrapping facts.ErrProvidedNodeIP (the kubelet-written addresses to reach the
// node by are unparsable or more than one per family, nothing was dialled)
// makes it deny the request (ProvidedNodeIPInvalid): waiting does not change
// the annotation, and a kubelet started with a correct --node-ip submits a new
// one.
//
// The controller calls Established beside its workers, never in them, and
// for one node at a time: while a node's lookup runs, its requests are set
// aside and queued again with the outcome when it ends, so a node whose Talos
// API hangs holds no worker. Established must return once ctx ends.
type NodeFacts interface {
	Established(ctx context.Context, node *corev1.Node) (*facts.Facts, error)
}

// RememberedFacts is what a NodeFacts may offer besides Established: the
// facts it remembers for a node, at hand without waiting (ccm/facts.Source
// has it). With it, a request whose node's facts are remembered is decided in
// one pass, without a lookup; without it, every request waits for a lookup
// beside the workers.
type RememberedFacts interface {
	Remembered(nodeName string) (*facts.Facts, bool)
}

// Event reasons on the CSR and on its Node.
const (
	EventReasonApproved = "CSRApproved"
	EventReasonDenied   = "CSRDenied"
	// EventReasonPostponed (Warning, on the CSR): the lookup of the node's
	// facts failed (AddressLookupFailed); the request stays pending.
	EventReasonPostponed = "CSRPostponed"
)

// pendingByNode indexes pending kubelet-serving CSRs by the node that requested them,
// so that a node becoming initialized (or getting new addresses) re-queues its CSRs.
const pendingByNode = "node-csr-approval/pending-by-node"

// errParked: the node's facts are being read beside the workers; the request
// is queued again when the lookup ends (lookups.finish).
var errParked = fmt.Errorf("the node's addresses are being read: %w", controlloop.ErrSetAside)

// errRetry asks the worker to look at a request again after a back-off.
var errRetry = fmt.Errorf("decision postponed: %w", controlloop.ErrRetry)

// Controller approves or denies kubelet serving certificate requests.
type Controller struct {
	client      kubernetes.Interface
	csrLister   certificateslisters.CertificateSigningRequestLister
	csrIndexer  cache.Indexer
	nodeLister  corelisters.NodeLister
	nodeIndexer cache.Indexer
	cluster     *clusterAddresses
	facts       NodeFacts
	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster // set when the controller owns its recorder
	loop        *controlloop.Loop
	opts        Options
	lookups     lookups
}

// Back-off of a node whose lookup failed (no answer, or an error other than
// facts.ErrIdentity and facts.ErrProvidedNodeIP): no new lookup of the node is
// started before it has passed. It doubles with each failure in a row.
const (
	lookupBaseDelay = time.Second
	lookupMaxDelay  = 5 * time.Minute
)

// lookups runs the reads of nodes' facts beside the workers, never in them:
// a worker that needs a node's facts starts the node's lookup (or finds it
// running) and sets the request aside; when the lookup ends, every request
// set aside meanwhile gets its outcome and is queued again. So a worker never
// waits for a Talos API, and a node whose Talos API hangs holds no worker.
// At most one lookup per node is in flight; a node whose lookup failed gets
// no new one before its back-off has passed (a circuit breaker: its requests
// stay pending meanwhile).
type lookups struct {
	mu    sync.Mutex
	nodes map[string]*nodeLookup  // by node name
	ready map[string]lookupResult // by CSR name: the outcome of the lookup it waited for
	wg    sync.WaitGroup          // lookups in flight
}

// nodeLookup is what the controller knows about the lookups of one node.
type nodeLookup struct {
	inflight bool
	deleted  bool     // the Node was deleted while its lookup ran
	parked   []string // CSRs waiting for the lookup in flight
	failures int      // failed lookups in a row
	retryAt  time.Time
	lastErr  error
}

// lookupResult is the outcome of one lookup, handed to one request.
type lookupResult struct {
	node  string
	facts *facts.Facts
	err   error
}

// lookupStep is what a worker does with a request whose node's facts it needs.
type lookupStep int

const (
	// stepDecide: the outcome is in hand.
	stepDecide lookupStep = iota
	// stepStart: the caller starts the node's lookup; the request is set aside.
	stepStart
	// stepWait: the node's lookup is in flight; the request is set aside.
	stepWait
	// stepBackOff: the node's last lookup failed and its back-off has not passed.
	stepBackOff
)

// next tells a worker what to do for request csr of node: decide on the
// outcome handed to it (res), start the node's lookup, wait for the one in
// flight, or wait for the node's back-off (last is then its last error).
func (l *lookups) next(node, csr string, now time.Time) (step lookupStep, res lookupResult, last error, retryAt time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.nodes == nil {
		l.nodes, l.ready = map[string]*nodeLookup{}, map[string]lookupResult{}
	}
	if r, ok := l.ready[csr]; ok {
		delete(l.ready, csr)
		if r.node == node {
			return stepDecide, r, nil, time.Time{}
		}
		// a request of another node by the same name: look again
	}
	n := l.nodes[node]
	if n == nil {
		n = &nodeLookup{}
		l.nodes[node] = n
	}
	switch {
	case n.inflight:
		if !slices.Contains(n.parked, csr) {
			n.parked = append(n.parked, csr)
		}
		return stepWait, lookupResult{}, nil, time.Time{}
	case now.Before(n.retryAt):
		return stepBackOff, lookupResult{}, n.lastErr, n.retryAt
	}
	n.inflight, n.parked = true, []string{csr}
	l.wg.Add(1)
	return stepStart, lookupResult{}, nil, time.Time{}
}

// finish records the outcome of node's lookup, hands it to every request set
// aside for it and returns their names.
func (l *lookups) finish(node string, f *facts.Facts, err error, now time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodes[node]
	parked := n.parked
	n.inflight, n.parked = false, nil
	switch {
	case n.deleted || err == nil || errors.Is(err, facts.ErrIdentity) || errors.Is(err, facts.ErrProvidedNodeIP):
		// an answer (or a refusal that waiting does not change): no back-off;
		// nothing needs remembering
		delete(l.nodes, node)
	default:
		n.failures++
		n.retryAt = now.Add(backOff(n.failures))
		n.lastErr = err
	}
	for _, csr := range parked {
		l.ready[csr] = lookupResult{node: node, facts: f, err: err}
	}
	return parked
}

// abandon ends node's lookup without an outcome (the controller is stopping).
func (l *lookups) abandon(node string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.nodes[node]; n != nil {
		n.inflight, n.parked = false, nil
	}
}

// dropNode forgets what is known about a node (deleted), once its lookup in
// flight, if any, has ended.
func (l *lookups) dropNode(node string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch n := l.nodes[node]; {
	case n == nil:
	case n.inflight:
		n.deleted = true // forgotten when the lookup ends
	default:
		delete(l.nodes, node)
	}
}

// dropRequest forgets an outcome waiting for a request that is gone.
func (l *lookups) dropRequest(csr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.ready, csr)
}

// backOff is the wait after failures failed lookups in a row.
func backOff(failures int) time.Duration {
	d := lookupBaseDelay
	for i := 1; i < failures && d < lookupMaxDelay; i++ {
		d *= 2
	}
	return min(d, lookupMaxDelay)
}

// NewController wires the controller to the shared informers. Start the informer
// factory and call Run. A nil recorder makes the controller record events through
// a broadcaster of its own (component "node-csr-approval"); a nil opts means
// NewOptions().
func NewController(
	client kubernetes.Interface,
	csrInformer certificatesinformers.CertificateSigningRequestInformer,
	nodeInformer coreinformers.NodeInformer,
	nodeFacts NodeFacts,
	recorder record.EventRecorder,
	opts *Options,
) (*Controller, error) {
	const op = "csr.NewController"
	if opts == nil {
		opts = NewOptions()
	}
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if client == nil || csrInformer == nil || nodeInformer == nil || nodeFacts == nil {
		return nil, fmt.Errorf("%s: client, informers and node facts are required", op)
	}
	registerMetrics()

	o := *opts
	o.AllowedIPRanges = slices.Clone(opts.AllowedIPRanges)
	o.AllowedDNSSuffixes = slices.Clone(opts.AllowedDNSSuffixes)
	o.ReservedIPRanges = slices.Clone(opts.ReservedIPRanges)
	c := &Controller{
		client:      client,
		csrLister:   csrInformer.Lister(),
		csrIndexer:  csrInformer.Informer().GetIndexer(),
		nodeLister:  nodeInformer.Lister(),
		nodeIndexer: nodeInformer.Informer().GetIndexer(),
		cluster:     newClusterAddresses(client, o.APIServer),
		facts:       nodeFacts,
		recorder:    recorder,
		opts:        o,
	}
	var err error
	c.loop, err = controlloop.New(controlloop.Config{
		Name: names.CSRApprovalController, Kind: "csr", Workers: o.Workers,
		BaseDelay: time.Second, MaxDelay: 5 * time.Minute,
		Sync:   c.sync,
		Synced: []cache.InformerSynced{csrInformer.Informer().HasSynced, nodeInformer.Informer().HasSynced},
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if c.recorder == nil {
		c.broadcaster = record.NewBroadcaster()
		c.recorder = c.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: names.CSRApprovalController})
	}

	csrInf := csrInformer.Informer()
	if _, exists := csrInf.GetIndexer().GetIndexers()[pendingByNode]; !exists {
		if err := csrInf.AddIndexers(cache.Indexers{pendingByNode: indexPendingByNode}); err != nil {
			return nil, fmt.Errorf("%s: add CSR index: %w", op, err)
		}
	}
	if _, exists := nodeInformer.Informer().GetIndexer().GetIndexers()[nodesByAddress]; !exists {
		if err := nodeInformer.Informer().AddIndexers(cache.Indexers{nodesByAddress: indexNodesByAddress}); err != nil {
			return nil, fmt.Errorf("%s: add node index: %w", op, err)
		}
	}
	if _, err := csrInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueCSR,
		UpdateFunc: func(_, obj any) { c.enqueueCSR(obj) }, // also resyncs
	}); err != nil {
		return nil, fmt.Errorf("%s: watch CSRs: %w", op, err)
	}
	if _, err := nodeInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueNodeCSRs(obj) },
		UpdateFunc: c.nodeUpdated,
		DeleteFunc: c.nodeDeleted,
	}); err != nil {
		return nil, fmt.Errorf("%s: watch nodes: %w", op, err)
	}
	return c, nil
}

// Run decides requests with opts.Workers workers until ctx is done and
// returns once they have finished.
func (c *Controller) Run(ctx context.Context) {
	if c.broadcaster != nil {
		c.broadcaster.StartStructuredLogging(3)
		c.broadcaster.StartRecordingToSink(events.NewAsyncSink(ctx, &typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")}, events.Workers, events.Queue))
		defer c.broadcaster.Shutdown()
	}

	c.cluster.run(ctx)
	klog.InfoS("Starting controller", "controller", names.CSRApprovalController, "workers", c.opts.Workers)
	defer klog.InfoS("Stopped controller", "controller", names.CSRApprovalController)
	c.loop.Run(ctx)
	c.lookups.wg.Wait() // the lookups end with ctx
}

// sync decides the CSR called name and records the decision.
func (c *Controller) sync(ctx context.Context, name string) error {
	const op = "csr/Controller.sync"
	csr, err := c.csrLister.Get(name)
	if apierrors.IsNotFound(err) {
		c.lookups.dropRequest(name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if !Pending(csr) {
		c.lookups.dropRequest(name)
		return nil
	}

	d, node, err := c.decide(ctx, csr)
	if errors.Is(err, errParked) {
		// queued again when the node's lookup ends
		klog.V(4).InfoS("Kubelet serving CSR waits for its node's address lookup", "csr", klog.KObj(csr))
	}
	if err != nil {
		return fmt.Errorf("%s: %s: %w", op, name, err)
	}
	switch d.Action {
	case Approve, Deny:
		return c.record(ctx, csr, node, d)
	case Retry:
		countDecision(d)
		klog.V(2).InfoS("Postponed kubelet serving CSR", "csr", klog.KObj(csr), "user", csr.Spec.Username, "reason", d.Reason, "message", d.Message)
		return errRetry
	default:
		return nil
	}
}

// decide gathers what Validate needs and calls it, in stages: the node is read only
// for requests that pass the checks on the request alone, and the node's facts (a
// Talos API lookup when not remembered) only for initialized nodes. node is returned for
// events; it is nil when the requester's node does not exist.
func (c *Controller) decide(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (Decision, *corev1.Node, error) {
	var node *corev1.Node
	if name, ok := NodeName(csr.Spec.Username); ok {
		node, _ = c.nodeLister.Get(name) // NotFound is the only lister error
	}
	req, d, ok := checkRequest(csr, &c.opts)
	if !ok {
		return d, node, nil
	}
	if node == nil {
		// The informer may lag behind a node that registered a moment ago; a denial is
		// final, so ask the API server before concluding the node does not exist.
		n, err := c.client.CoreV1().Nodes().Get(ctx, req.nodeName, metav1.GetOptions{})
		switch {
		case err == nil:
			node = n
		case !apierrors.IsNotFound(err):
			return Decision{}, nil, fmt.Errorf("get node %s: %w", req.nodeName, err)
		}
	}
	if d, ok := c.checkCluster(req, node); !ok {
		return d, node, nil
	}
	var established []corev1.NodeAddress
	if node != nil && (!c.opts.WaitForInitialization || Initialized(node)) {
		step, res, last, retryAt := stepDecide, lookupResult{}, error(nil), time.Time{}
		if f, ok := c.remembered(node.Name); ok {
			// what Established would return at once
			c.lookups.dropRequest(csr.Name)
			res.facts = f
		} else {
			step, res, last, retryAt = c.lookups.next(node.Name, csr.Name, time.Now())
		}
		switch step {
		case stepStart:
			go c.lookup(ctx, node)
			return Decision{}, node, errParked
		case stepWait:
			return Decision{}, node, errParked
		case stepBackOff:
			return Decision{Action: Retry, Reason: ReasonAddressLookupFailed,
				Message: fmt.Sprintf("the last lookup of node %q failed, the next one not before %s: %v", node.Name, retryAt.UTC().Format(time.RFC3339), last)}, node, nil
		}
		f, err := res.facts, res.err
		if err == nil && f != nil {
			established = slices.Clone(f.Addresses) // the facts are shared
		}
		switch {
		case errors.Is(err, facts.ErrIdentity):
			return Decision{Action: Deny, Reason: ReasonNodeIdentityMismatch,
				Message: fmt.Sprintf("the Talos API reached for node %q is another machine: %s", node.Name, clipLong(err.Error()))}, node, nil
		case errors.Is(err, facts.ErrProvidedNodeIP):
			return Decision{Action: Deny, Reason: ReasonProvidedNodeIPInvalid,
				Message: fmt.Sprintf("the addresses node %q gives to reach it are refused, nothing was dialled: %s", node.Name, clipLong(err.Error()))}, node, nil
		case err != nil:
			klog.ErrorS(err, "Cannot read the addresses talos-ccm established for node", "csr", klog.KObj(csr), "node", klog.KObj(node))
			d := Decision{Action: Retry, Reason: ReasonAddressLookupFailed,
				Message: fmt.Sprintf("cannot read the addresses of node %q: %s", node.Name, clipLong(err.Error()))}
			// once per failed lookup (the node's back-off spaces them), not per pass
			c.recorder.Eventf(csr, corev1.EventTypeWarning, EventReasonPostponed,
				"Postponed kubelet serving certificate request of %s (%s): %s; it stays pending, looked at again after a back-off", clip(csr.Spec.Username), d.Reason, d.Message)
			return d, node, nil
		}
	}
	d = checkNode(req, node, established, &c.opts)
	if d.Action == Approve {
		if ex := c.exclusive(node, req.x509); ex.Action != Ignore {
			d = ex
			if d.Action == Retry {
				// the recorder aggregates the same event of later passes
				c.recorder.Eventf(csr, corev1.EventTypeWarning, EventReasonPostponed,
					"Postponed kubelet serving certificate request of %s (%s): %s; it stays pending, looked at again later", clip(csr.Spec.Username), d.Reason, d.Message)
			}
		}
	}
	return d, node, nil
}

// checkCluster refuses a SAN that is the cluster's own (clusterAddresses),
// and postpones every request until the cluster's addresses are known. An
// API server endpoint is a control-plane node's own address (the API server
// runs in its host network): only a control-plane node (a label kubelets
// cannot set, NodeRestriction) may have it, and then only when established
// for it and no other node, as every address.
func (c *Controller) checkCluster(req *request, node *corev1.Node) (Decision, bool) {
	if !c.cluster.synced() {
		return Decision{Action: Retry, Reason: ReasonClusterAddressesUnknown,
			Message: "the cluster's Service CIDRs and API server endpoints have not been read yet"}, false
	}
	for _, n := range req.x509.DNSNames {
		if why := c.cluster.name(n); why != "" {
			return deny(ReasonClusterAddress, "DNS SAN %q is %s, never a node's", clip(n), why), false
		}
	}
	for _, raw := range req.x509.IPAddresses {
		if ip, ok := netip.AddrFromSlice(raw); ok {
			if why, endpoint := c.cluster.ip(ip.Unmap()); why != "" && !(endpoint && controlPlane(node)) {
				return deny(ReasonClusterAddress, "IP SAN %s is %s, never a node's", ip.Unmap(), why), false
			}
		}
	}
	return Decision{}, true
}

// controlPlane reports whether node is a control-plane node.
func controlPlane(node *corev1.Node) bool {
	if node == nil {
		return false
	}
	_, ok := node.Labels[controlPlaneLabel]
	return ok
}

// controlPlaneLabel marks control-plane nodes; NodeRestriction keeps kubelets
// from setting node-role.kubernetes.io labels.
const controlPlaneLabel = "node-role.kubernetes.io/control-plane"

// remembered returns the facts the NodeFacts remembers for the node, if it
// offers them.
func (c *Controller) remembered(nodeName string) (*facts.Facts, bool) {
	if r, ok := c.facts.(RememberedFacts); ok {
		return r.Remembered(nodeName)
	}
	return nil, false
}

// lookup reads node's facts beside the workers and queues again every
// request that waited for them, with the outcome in hand. It runs until the
// facts source answers or gives up (--talos-lookup-timeout), or until ctx ends.
func (c *Controller) lookup(ctx context.Context, node *corev1.Node) {
	defer c.lookups.wg.Done()
	f, err := c.facts.Established(ctx, node)
	if err != nil && ctx.Err() != nil {
		c.lookups.abandon(node.Name) // stopping: nothing is queued any more
		return
	}
	for _, name := range c.lookups.finish(node.Name, f, err, time.Now()) {
		c.loop.Add(name)
	}
}

// record writes the decision as an Approved or Denied condition through the approval
// subresource. On a conflict it re-reads the request and gives up if someone else
// decided it meanwhile, or if it was replaced by another request of the same name.
func (c *Controller) record(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, node *corev1.Node, d Decision) error {
	const op = "csr/Controller.record"
	cond := certificatesv1.CertificateSigningRequestCondition{
		Type:           certificatesv1.CertificateApproved,
		Status:         corev1.ConditionTrue,
		Reason:         d.Reason,
		Message:        d.Message,
		LastUpdateTime: metav1.Now(),
	}
	if d.Action == Deny {
		cond.Type = certificatesv1.CertificateDenied
	}
	api := c.client.CertificatesV1().CertificateSigningRequests()
	current, superseded := csr, false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if current.UID != csr.UID || !Pending(current) {
			superseded = true
			return nil
		}
		upd := current.DeepCopy()
		upd.Status.Conditions = append(upd.Status.Conditions, cond)
		_, err := api.UpdateApproval(ctx, upd.Name, upd, metav1.UpdateOptions{})
		switch {
		case apierrors.IsNotFound(err):
			superseded = true
			return nil
		case apierrors.IsConflict(err):
			fresh, getErr := api.Get(ctx, csr.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(getErr) {
				superseded = true
				return nil
			}
			if getErr != nil {
				return getErr
			}
			current = fresh
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %s %s: %w", op, d.Action, csr.Name, err)
	}
	if superseded {
		klog.V(2).InfoS("Kubelet serving CSR was decided or replaced by someone else", "csr", klog.KObj(csr))
		return nil
	}

	countDecision(d)
	nodeName, _ := NodeName(csr.Spec.Username)
	eventType, eventReason, verb := corev1.EventTypeNormal, EventReasonApproved, "Approved"
	if d.Action == Deny {
		eventType, eventReason, verb = corev1.EventTypeWarning, EventReasonDenied, "Denied"
	}
	klog.InfoS(verb+" kubelet serving CSR", "csr", klog.KObj(csr), "user", csr.Spec.Username, "node", klog.KRef("", nodeName), "reason", d.Reason, "message", d.Message)
	c.recorder.Eventf(csr, eventType, eventReason, "%s kubelet serving certificate request of %s (%s): %s", verb, clip(csr.Spec.Username), d.Reason, d.Message)
	if node != nil {
		c.recorder.Eventf(node, eventType, eventReason, "%s kubelet serving certificate request %s (%s): %s", verb, csr.Name, d.Reason, d.Message)
	}
	return nil
}

func (c *Controller) enqueueCSR(obj any) {
	if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok && Pending(csr) {
		c.loop.Add(csr.Name)
	}
}

// nodeUpdated re-queues a node's pending CSRs when what their decision depends on
// changed: initialization, providerID, or the addresses talos-ccm wrote.
func (c *Controller) nodeUpdated(oldObj, newObj any) {
	o, ok1 := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if !ok1 || !ok2 {
		return
	}
	if Initialized(o) != Initialized(n) || o.Spec.ProviderID != n.Spec.ProviderID || !slices.Equal(o.Status.Addresses, n.Status.Addresses) {
		c.enqueueNodeCSRs(n)
	}
}

// nodeDeleted forgets the node's lookup back-off.
func (c *Controller) nodeDeleted(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if node, ok := obj.(*corev1.Node); ok {
		c.lookups.dropNode(node.Name)
	}
}

func (c *Controller) enqueueNodeCSRs(obj any) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	objs, err := c.csrIndexer.ByIndex(pendingByNode, node.Name)
	if err != nil {
		return
	}
	for _, o := range objs {
		c.enqueueCSR(o)
	}
}

func indexPendingByNode(obj any) ([]string, error) {
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok || !Pending(csr) {
		return nil, nil
	}
	if name, ok := NodeName(csr.Spec.Username); ok {
		return []string{name}, nil
	}
	return nil, nil
}
