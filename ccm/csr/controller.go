package csr

import (
	"context"
	"errors"
	"fmt"
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
// The controller never asks for the same node from two workers at once: while
// one worker waits for a node's facts, that node's other requests are set
// aside and queued again when the answer is in, so a node whose Talos API hangs
// holds at most one worker.
type NodeFacts interface {
	Established(ctx context.Context, node *corev1.Node) (*facts.Facts, error)
}

// Event reasons on the CSR and on its Node.
const (
	EventReasonApproved = "CSRApproved"
	EventReasonDenied   = "CSRDenied"
)

// pendingByNode indexes pending kubelet-serving CSRs by the node that requested them,
// so that a node becoming initialized (or getting new addresses) re-queues its CSRs.
const pendingByNode = "node-csr-approval/pending-by-node"

// errParked: another worker is reading the node's addresses; the request is
// queued again when it is done (lookups.end).
var errParked = fmt.Errorf("the node's addresses are being read by another worker: %w", controlloop.ErrSetAside)

// errRetry asks the worker to look at a request again after a back-off.
var errRetry = fmt.Errorf("decision postponed: %w", controlloop.ErrRetry)

// Controller approves or denies kubelet serving certificate requests.
type Controller struct {
	client      kubernetes.Interface
	csrLister   certificateslisters.CertificateSigningRequestLister
	csrIndexer  cache.Indexer
	nodeLister  corelisters.NodeLister
	facts       NodeFacts
	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster // set when the controller owns its recorder
	loop        *controlloop.Loop
	opts        Options
	lookups     lookups
}

// lookups tracks the nodes whose addresses a worker is reading, and the requests
// set aside meanwhile.
type lookups struct {
	mu     sync.Mutex
	parked map[string][]string // node name -> CSR names waiting for its lookup
}

// begin reports whether the caller may read node's addresses; if another worker
// is doing so, csr is set aside until it ends.
func (l *lookups) begin(node, csr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.parked == nil {
		l.parked = map[string][]string{}
	}
	waiting, busy := l.parked[node]
	if !busy {
		l.parked[node] = nil
		return true
	}
	if !slices.Contains(waiting, csr) {
		l.parked[node] = append(waiting, csr)
	}
	return false
}

// end marks node's lookup done and returns the requests set aside meanwhile.
func (l *lookups) end(node string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	waiting := l.parked[node]
	delete(l.parked, node)
	return waiting
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
	c := &Controller{
		client:     client,
		csrLister:  csrInformer.Lister(),
		csrIndexer: csrInformer.Informer().GetIndexer(),
		nodeLister: nodeInformer.Lister(),
		facts:      nodeFacts,
		recorder:   recorder,
		opts:       o,
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
	if _, err := csrInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueCSR,
		UpdateFunc: func(_, obj any) { c.enqueueCSR(obj) }, // also resyncs
	}); err != nil {
		return nil, fmt.Errorf("%s: watch CSRs: %w", op, err)
	}
	if _, err := nodeInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueNodeCSRs(obj) },
		UpdateFunc: c.nodeUpdated,
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

	klog.InfoS("Starting controller", "controller", names.CSRApprovalController, "workers", c.opts.Workers)
	defer klog.InfoS("Stopped controller", "controller", names.CSRApprovalController)
	c.loop.Run(ctx)
}

// sync decides the CSR called name and records the decision.
func (c *Controller) sync(ctx context.Context, name string) error {
	const op = "csr/Controller.sync"
	csr, err := c.csrLister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if !Pending(csr) {
		return nil
	}

	d, node, err := c.decide(ctx, csr)
	if errors.Is(err, errParked) {
		// queued again by the worker reading the node's addresses
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
	var established []corev1.NodeAddress
	if node != nil && (!c.opts.WaitForInitialization || Initialized(node)) {
		if !c.lookups.begin(node.Name, csr.Name) {
			return Decision{}, node, errParked
		}
		f, err := c.facts.Established(ctx, node)
		if err == nil && f != nil {
			established = slices.Clone(f.Addresses) // the facts are shared
		}
		for _, parked := range c.lookups.end(node.Name) {
			if err != nil {
				c.loop.AddRateLimited(parked)
			} else {
				c.loop.Add(parked)
			}
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
			return Decision{Action: Retry, Reason: ReasonAddressLookupFailed,
				Message: fmt.Sprintf("cannot read the addresses of node %q: %v", node.Name, err)}, node, nil
		}
	}
	return checkNode(req, node, established, &c.opts), node, nil
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
