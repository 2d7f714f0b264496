package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/controlloop"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/iplist"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// NodeFacts is where the cloud allocator learns a node's addresses
// (ccm/facts.Source): the identity-checked, remembered facts cloud-node and
// node-csr-approval use, never a Talos API read of its own.
type NodeFacts interface {
	Established(ctx context.Context, node *corev1.Node) (*facts.Facts, error)
}

// ClusterNetworkReader reads the control plane's pod and service CIDRs from
// the Talos API of a control-plane node (when --cluster-cidr is not set).
// *talos.Client implements it.
type ClusterNetworkReader interface {
	ClusterNetwork(ctx context.Context, node string) (*talos.ClusterNetwork, error)
}

var _ ClusterNetworkReader = (*talos.Client)(nil)

// Event reasons on nodes.
const (
	// EventReasonCIDRNotAvailable: the pool is exhausted; the node waits.
	EventReasonCIDRNotAvailable = "CIDRNotAvailable"
	// EventReasonCIDRAssignmentFailed: writing spec.podCIDRs failed; retried.
	EventReasonCIDRAssignmentFailed = "CIDRAssignmentFailed"
	// EventReasonCIDROverlap: the node carries a CIDR that overlaps another
	// node's or the service range (written by someone else).
	EventReasonCIDROverlap = "CIDROverlap"
	// EventReasonNodePrefixTooSmall: cloud allocator, the node's global IPv6
	// prefix has no room for a pod CIDR; the range allocator is used instead.
	EventReasonNodePrefixTooSmall = "NodePrefixTooSmall"
	// EventReasonTalosAPIUnavailable: cloud allocator, the node's Talos API did
	// not answer; retried. The node's facts may fail for another reason too,
	// recorded as facts.Reason says (e.g. NodeIdentityMismatch); retried.
	EventReasonTalosAPIUnavailable = facts.ReasonTalosAPIUnavailable
	// EventReasonNoNodeIP: cloud allocator, the node has neither the
	// provided-node-ip annotation nor an InternalIP; retried.
	EventReasonNoNodeIP = facts.ReasonNoNodeIP
)

// LabelControlPlane marks the nodes whose Talos API holds the control plane's
// k8s/ControllerManagerConfig.
const LabelControlPlane = "node-role.kubernetes.io/control-plane"

// errWait: the node waits for space; retried after a back-off or when a CIDR
// is released.
var errWait = fmt.Errorf("waiting for a free CIDR: %w", controlloop.ErrRetry)

// Controller allocates spec.podCIDRs to nodes.
type Controller struct {
	client      kubernetes.Interface
	lister      corelisters.NodeLister
	facts       NodeFacts
	network     ClusterNetworkReader
	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster // set when the controller owns its recorder
	loop        *controlloop.Loop
	cfg         Config

	// startMu orders informer events against the start-up rebuild: handlers
	// hold it shared, the rebuild exclusively, so that no deletion slips in
	// between the rebuild's snapshot and alloc being set.
	startMu sync.RWMutex
	alloc   *allocator // nil until the rebuild is done
	ready   chan struct{}

	parkMu sync.Mutex
	parked map[string]bool // nodes waiting after a failure; true: waiting for space
}

// NewController wires the controller to the node informer. Start the informer
// factory, then `go c.Run(ctx)`. nodeFacts may be nil unless the cloud
// allocator is used, network unless cfg has no cluster CIDRs. A nil recorder
// makes the controller record events through a broadcaster of its own.
func NewController(client kubernetes.Interface, nodeInformer coreinformers.NodeInformer, nodeFacts NodeFacts, network ClusterNetworkReader, recorder record.EventRecorder, cfg Config) (*Controller, error) {
	const op = "ipam.NewController"
	if cfg.AllocatorType == "" {
		cfg.AllocatorType = RangeAllocator
	}
	if cfg.Workers == 0 {
		cfg.Workers = NewOptions().Workers
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if client == nil || nodeInformer == nil {
		return nil, fmt.Errorf("%s: client and node informer are required", op)
	}
	if nodeFacts == nil && cfg.AllocatorType == CloudAllocator {
		return nil, fmt.Errorf("%s: the node facts source is required for %s", op, cfg.AllocatorType)
	}
	if network == nil && len(cfg.ClusterCIDRs) == 0 {
		return nil, fmt.Errorf("%s: a Talos client is required without --cluster-cidr", op)
	}
	registerMetrics()
	c := &Controller{
		client:   client,
		lister:   nodeInformer.Lister(),
		facts:    nodeFacts,
		network:  network,
		recorder: recorder,
		cfg:      cfg,
		ready:    make(chan struct{}),
		parked:   map[string]bool{},
	}
	var err error
	c.loop, err = controlloop.New(controlloop.Config{
		Name: names.IPAMController, Kind: "node", Workers: cfg.Workers,
		BaseDelay: time.Second, MaxDelay: 5 * time.Minute,
		Sync:   c.syncAndPark,
		Synced: []cache.InformerSynced{nodeInformer.Informer().HasSynced},
		Start:  c.begin,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if c.recorder == nil {
		c.broadcaster = record.NewBroadcaster()
		c.recorder = c.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: names.IPAMController})
	}
	if _, err := nodeInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.nodeChanged(nil, obj) },
		UpdateFunc: c.nodeChanged,
		DeleteFunc: c.nodeDeleted,
	}); err != nil {
		return nil, fmt.Errorf("%s: watch nodes: %w", op, err)
	}
	return c, nil
}

// Ready is closed once the controller has rebuilt its ledger from the nodes
// and starts allocating.
func (c *Controller) Ready() <-chan struct{} { return c.ready }

// Run allocates until ctx is done and returns once its workers have finished.
func (c *Controller) Run(ctx context.Context) {
	if c.broadcaster != nil {
		c.broadcaster.StartStructuredLogging(3)
		c.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
		defer c.broadcaster.Shutdown()
	}
	klog.InfoS("Starting controller", "controller", names.IPAMController, "allocator", c.cfg.AllocatorType, "workers", c.cfg.Workers)
	defer klog.InfoS("Stopped controller", "controller", names.IPAMController)
	c.loop.Run(ctx)
}

// begin runs once the node cache has synced: it learns the cluster CIDRs and
// rebuilds the ledger; false when ctx ended first or IPAM cannot start.
func (c *Controller) begin(ctx context.Context) bool {
	clusterCIDRs, serviceCIDRs, ok := c.clusterNetwork(ctx)
	if !ok {
		return false
	}
	if err := c.start(clusterCIDRs, serviceCIDRs); err != nil {
		utilruntime.HandleErrorWithContext(ctx, err, "Node IPAM cannot start", "clusterCIDRs", iplist.Join(clusterCIDRs))
		return false
	}
	return true
}

// start builds the pools, rebuilds the ledger from every node's spec.podCIDRs
// and queues the nodes that have none.
func (c *Controller) start(clusterCIDRs, serviceCIDRs []netip.Prefix) error {
	const op = "ipam/Controller.start"
	cloud := c.cfg.AllocatorType == CloudAllocator
	a, err := newAllocator(clusterCIDRs, func(p netip.Prefix) int { return c.cfg.MaskSize(p, clusterCIDRs) }, serviceCIDRs, cloud)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	a.publish = publishPool

	c.startMu.Lock()
	began := time.Now()
	nodes, err := c.lister.List(labels.Everything())
	if err != nil {
		c.startMu.Unlock()
		return fmt.Errorf("%s: list nodes: %w", op, err)
	}
	held := make([]nodeCIDRs, 0, len(nodes))
	var pending []string
	for _, n := range nodes {
		if cidrs := podCIDRs(n); len(cidrs) > 0 {
			held = append(held, nodeCIDRs{holder: holder{uid: n.UID, name: n.Name}, cidrs: cidrs})
		} else {
			pending = append(pending, n.Name)
		}
	}
	overlaps := a.rebuild(held)
	took := time.Since(began)
	c.alloc = a
	c.startMu.Unlock()

	rebuildSeconds.Set(took.Seconds())
	klog.InfoS("Rebuilt pod CIDR ledger from nodes", "controller", names.IPAMController, "nodes", len(nodes), "allocated", len(held),
		"pending", len(pending), "clusterCIDRs", iplist.Join(clusterCIDRs), "serviceCIDRs", iplist.Join(serviceCIDRs), "duration", took)
	c.reportOverlaps(overlaps)
	for _, name := range pending {
		c.loop.Add(name)
	}
	close(c.ready)
	return nil
}

// clusterNetwork returns the configured CIDRs, or reads them from the Talos
// API of a control-plane node, retrying until one answers (or ctx ends).
func (c *Controller) clusterNetwork(ctx context.Context) (cluster, service []netip.Prefix, ok bool) {
	if len(c.cfg.ClusterCIDRs) > 0 {
		return c.cfg.ClusterCIDRs, c.cfg.ServiceCIDRs, true
	}
	cp, _ := labels.NewRequirement(LabelControlPlane, selection.Exists, nil)
	sel := labels.NewSelector().Add(*cp)
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: time.Minute}
	for {
		cluster, service, err := c.readClusterNetwork(ctx, sel)
		if err == nil {
			if len(c.cfg.ServiceCIDRs) > 0 {
				service = c.cfg.ServiceCIDRs
			}
			klog.InfoS("Read cluster network from Talos", "controller", names.IPAMController,
				"clusterCIDRs", iplist.Join(cluster), "serviceCIDRs", iplist.Join(service))
			return cluster, service, true
		}
		klog.ErrorS(err, "Cannot read the pod CIDRs from the Talos control plane yet; no node gets a pod CIDR until then (or set --cluster-cidr)",
			"controller", names.IPAMController)
		select {
		case <-ctx.Done():
			return nil, nil, false
		case <-time.After(backoff.Step()):
		}
	}
}

func (c *Controller) readClusterNetwork(ctx context.Context, sel labels.Selector) (cluster, service []netip.Prefix, err error) {
	const op = "ipam/Controller.readClusterNetwork"
	nodes, err := c.lister.List(sel)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	if len(nodes) == 0 {
		return nil, nil, fmt.Errorf("%s: no node labelled %s yet", op, LabelControlPlane)
	}
	var errs []error
	for _, n := range nodes {
		ips, err := facts.NodeIPs(n, false)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
			continue
		}
		for _, ip := range ips {
			cn, err := c.network.ClusterNetwork(ctx, ip.String())
			if err != nil {
				errs = append(errs, err)
				continue
			}
			source := fmt.Sprintf("k8s/ControllerManagerConfig podCIDRs of node %s", n.Name)
			if len(cn.PodCIDRs) == 0 {
				errs = append(errs, fmt.Errorf("%s: empty", source))
				continue
			}
			if err := c.cfg.ValidateCIDRs(cn.PodCIDRs, source); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := checkFamilies("k8s/ControllerManagerConfig serviceCIDRs of node "+n.Name, cn.ServiceCIDRs); err != nil {
				errs = append(errs, err)
				continue
			}
			return cn.PodCIDRs, cn.ServiceCIDRs, nil
		}
	}
	return nil, nil, fmt.Errorf("%s: %w", op, errors.Join(errs...))
}

// nodeChanged queues nodes without CIDRs and records CIDRs written by anyone.
func (c *Controller) nodeChanged(oldObj, obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	if len(n.Spec.PodCIDRs) == 0 && n.Spec.PodCIDR == "" {
		if !c.isParked(n.Name) {
			c.loop.Add(n.Name)
		}
		return
	}
	if old, ok := oldObj.(*corev1.Node); ok && old.Spec.PodCIDR == n.Spec.PodCIDR && equalStrings(old.Spec.PodCIDRs, n.Spec.PodCIDRs) {
		return
	}
	c.startMu.RLock()
	defer c.startMu.RUnlock()
	if c.alloc != nil {
		c.observe(n, podCIDRs(n))
		c.unpark(n.Name)
	}
}

// nodeDeleted frees the node's CIDRs and wakes nodes waiting for space.
func (c *Controller) nodeDeleted(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		tomb, isTomb := obj.(cache.DeletedFinalStateUnknown)
		if !isTomb {
			return
		}
		if n, ok = tomb.Obj.(*corev1.Node); !ok {
			return
		}
	}
	c.unpark(n.Name)
	c.startMu.RLock()
	defer c.startMu.RUnlock()
	if c.alloc == nil {
		return
	}
	if held := c.alloc.held(n.UID); len(held) > 0 && c.alloc.release(n.UID) {
		klog.V(2).InfoS("Released pod CIDRs of deleted node", "node", klog.KObj(n), "podCIDRs", iplist.Join(held))
		c.wakeParked()
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (c *Controller) park(name string, forSpace bool) {
	c.parkMu.Lock()
	c.parked[name] = forSpace
	c.parkMu.Unlock()
}

func (c *Controller) unpark(name string) {
	c.parkMu.Lock()
	delete(c.parked, name)
	c.parkMu.Unlock()
}

func (c *Controller) isParked(name string) bool {
	c.parkMu.Lock()
	defer c.parkMu.Unlock()
	_, ok := c.parked[name]
	return ok
}

// wakeParked retries every node that waits for space now.
func (c *Controller) wakeParked() {
	c.parkMu.Lock()
	defer c.parkMu.Unlock()
	for name, forSpace := range c.parked {
		if forSpace {
			c.loop.Add(name)
		}
	}
}

// syncAndPark is sync, and parks a node that is to be retried: a parked node
// is not queued again by its own updates (its back-off decides), and one
// waiting for space is woken when a CIDR is released.
func (c *Controller) syncAndPark(ctx context.Context, name string) error {
	err := c.sync(ctx, name)
	switch {
	case err == nil:
		c.unpark(name) // nothing else re-queues a parked node
	case errors.Is(err, errWait):
		c.park(name, true)
	default:
		c.park(name, false)
	}
	return err
}

// sync gives the node called name its pod CIDRs if it has none.
func (c *Controller) sync(ctx context.Context, name string) error {
	const op = "ipam/Controller.sync"
	node, err := c.lister.Get(name)
	if apierrors.IsNotFound(err) {
		c.unpark(name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if cidrs := podCIDRs(node); len(cidrs) > 0 {
		c.observe(node, cidrs)
		c.unpark(name)
		return nil
	}
	if c.cfg.AllocatorType == CloudAllocator && uninitialized(node) {
		return nil // its Talos addresses are not established yet; the taint's removal queues it again
	}
	wants, err := c.wants(ctx, node)
	if err != nil {
		return err
	}
	h := holder{uid: node.UID, name: node.Name}
	cidrs, err := c.alloc.reserve(h, wants)
	if err != nil {
		var ep *exhaustedPool
		if errors.As(err, &ep) {
			exhausted.WithLabelValues(ep.name).Inc()
		}
		klog.InfoS("No free pod CIDR; the node waits until one is released", "node", klog.KObj(node), "err", err)
		c.recorder.Eventf(node, corev1.EventTypeWarning, EventReasonCIDRNotAvailable,
			"No pod CIDR available: %v; the node stays without pod CIDR until a node is deleted", err)
		return fmt.Errorf("%w: %w", errWait, err)
	}
	return c.assign(ctx, node, h, cidrs)
}

// wants lists, per cluster CIDR (in order), where the node's CIDR of that
// family comes from.
func (c *Controller) wants(ctx context.Context, node *corev1.Node) ([]want, error) {
	out := make([]want, 0, len(c.alloc.ranges))
	for _, p := range c.alloc.ranges {
		if c.cfg.AllocatorType == CloudAllocator && p.cidr.Addr().Is6() {
			w, ok, err := c.cloudWant(ctx, node, p)
			if err != nil {
				return nil, err
			}
			if ok {
				out = append(out, w)
				continue
			}
		}
		out = append(out, want{pool: p})
	}
	return out, nil
}

// cloudWant returns a want on the node's global IPv6 prefix, from the
// node's established facts; ok is false when the range pool is to be used.
func (c *Controller) cloudWant(ctx context.Context, node *corev1.Node, fallback *pool) (w want, ok bool, err error) {
	const op = "ipam/Controller.cloudWant"
	f, err := c.facts.Established(ctx, node)
	if err != nil {
		switch reason := facts.Reason(err); {
		case ctx.Err() != nil:
			// shutting down
		case errors.Is(err, facts.ErrTalosAPI):
			// reported by the facts source's observer (ccm/reach): once,
			// with where and why, not on every retry
		case reason == EventReasonNoNodeIP:
			c.recorder.Event(node, corev1.EventTypeWarning, EventReasonNoNodeIP,
				"No alpha.kubernetes.io/provided-node-ip annotation and no InternalIP: cannot reach the node's Talos API to find its IPv6 prefix")
		default:
			if reason == "" {
				reason = EventReasonTalosAPIUnavailable
			}
			c.recorder.Eventf(node, corev1.EventTypeWarning, reason, "Cannot learn the node's addresses from its Talos API: %v", err)
		}
		return want{}, false, fmt.Errorf("%s: %w", op, err)
	}
	prefix, bits, found, err := GlobalPrefix(f.TalosAddresses, internalIPs(f.Addresses), fallback.bits)
	switch {
	case err != nil:
		c.recorder.Eventf(node, corev1.EventTypeWarning, EventReasonNodePrefixTooSmall,
			"Global IPv6 prefix unusable for pods (%v); the IPv6 pod CIDR comes from the cluster CIDR %s instead", err, fallback.cidr)
		return want{}, false, nil
	case !found:
		klog.V(2).InfoS("No global IPv6 prefix on the node; using the cluster CIDR", "node", klog.KObj(node), "clusterCIDR", fallback.cidr)
		return want{}, false, nil
	}
	avoid := make([]netip.Addr, 0, len(f.TalosAddresses))
	for _, a := range f.TalosAddresses {
		avoid = append(avoid, a.Prefix.Addr())
	}
	// other nodes on the same prefix (a shared LAN): keep their addresses out
	// of this node's pod CIDR. Only those inside the prefix are kept: a node
	// is allocated by scanning every node, not by gathering all their addresses.
	if others, lerr := c.lister.List(labels.Everything()); lerr == nil {
		for _, o := range others {
			if o.UID == node.UID {
				continue
			}
			for _, a := range hostAddrs(o) {
				if prefix.Contains(a) {
					avoid = append(avoid, a)
				}
			}
		}
	}
	p, err := c.alloc.cloudPoolFor(prefix, bits)
	if err != nil {
		return want{}, false, fmt.Errorf("%s: %w", op, err)
	}
	return want{pool: p, avoid: addrsIn(prefix, avoid)}, true, nil
}

// assign writes the CIDRs to the node. The API server is the arbiter:
// spec.podCIDRs can only be set once, and the patch only applies to this very
// node (UID). When the write fails the node is read again and its real state
// adopted.
func (c *Controller) assign(ctx context.Context, node *corev1.Node, h holder, cidrs []netip.Prefix) error {
	const op = "ipam/Controller.assign"
	strs := make([]string, len(cidrs))
	for i, p := range cidrs {
		strs[i] = p.String()
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": string(node.UID)},
		{"op": "add", "path": "/spec/podCIDR", "value": strs[0]},
		{"op": "add", "path": "/spec/podCIDRs", "value": strs},
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	_, err = c.client.CoreV1().Nodes().Patch(ctx, node.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: names.IPAMController})
	if err == nil {
		assignments.WithLabelValues("assigned").Inc()
		c.unpark(node.Name)
		klog.V(2).InfoS("Assigned pod CIDRs", "node", klog.KObj(node), "podCIDRs", strings.Join(strs, ","))
		return nil
	}
	writeErr := err
	fresh, err := c.client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || (err == nil && fresh.UID != node.UID):
		// gone (or replaced by a new node of the same name): free what it had
		if c.alloc.release(node.UID) {
			c.wakeParked()
		}
		return nil
	case err != nil:
		// cannot tell whether the write landed: keep the reservation, the retry reuses it
		return fmt.Errorf("%s: node %s: %w (and reading it back: %w)", op, node.Name, writeErr, err)
	}
	if have := podCIDRs(fresh); len(have) > 0 {
		assignments.WithLabelValues("adopted").Inc()
		klog.InfoS("Node already has pod CIDRs; adopting them", "node", klog.KObj(node), "podCIDRs", iplist.Join(have), "proposed", strings.Join(strs, ","))
		c.observe(fresh, have)
		c.unpark(node.Name)
		c.wakeParked()
		return nil
	}
	assignments.WithLabelValues("failed").Inc()
	c.recorder.Eventf(node, corev1.EventTypeWarning, EventReasonCIDRAssignmentFailed, "Writing pod CIDRs %s failed: %v", strings.Join(strs, ","), writeErr)
	return fmt.Errorf("%s: node %s: %w", op, node.Name, writeErr)
}

// observe records the node's CIDRs in the ledger and reports overlaps.
func (c *Controller) observe(node *corev1.Node, cidrs []netip.Prefix) {
	c.reportOverlaps(c.alloc.observe(holder{uid: node.UID, name: node.Name}, cidrs))
}

func (c *Controller) reportOverlaps(overlaps []Overlap) {
	for _, o := range overlaps {
		overlapsFound.Inc()
		klog.ErrorS(nil, "Node pod CIDR overlaps another allocation; it was written by someone else and is left as is",
			"node", klog.KRef("", o.Node), "podCIDR", o.CIDR, "overlaps", o.With, "heldBy", strings.Join(o.By, ","))
		ref := &corev1.ObjectReference{Kind: "Node", Name: o.Node, UID: o.NodeUID, APIVersion: "v1"}
		c.recorder.Eventf(ref, corev1.EventTypeWarning, EventReasonCIDROverlap,
			"Pod CIDR %s overlaps %s held by %s", o.CIDR, o.With, strings.Join(o.By, ","))
	}
}
