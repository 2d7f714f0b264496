// Package cloudnode is talos-ccm's cloud-node controller: it initializes nodes
// registered with the external-cloud-provider taint from the facts the talos
// facts source establishes (ccm/facts) and keeps addresses (and, in enforce
// mode, rule output) reconciled.
//
// Unlike k8s.io/cloud-provider's node controller it writes a node in exactly two
// requests: one Update (providerID, topology/instance-type labels, the routing
// label node.cloudprovider.kubernetes.io/platform and the other
// node.cloudprovider.kubernetes.io/* labels, rule labels, annotations and taints,
// taint removal) and one merge patch of status.addresses. The library's controller
// discards every kubernetes.io-namespaced AdditionalLabel, so the routing label
// would cost an extra GET+PATCH per node there. It never reads the Talos API
// itself (the facts source does) and never deletes nodes.
package cloudnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	cloudproviderapi "k8s.io/cloud-provider/api"
	cloudnodeutil "k8s.io/cloud-provider/node/helpers"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/controlloop"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Event reasons on Nodes; those of a facts lookup that failed are
// facts.Reason's.
const (
	ReasonInitialized         = "Initialized"
	ReasonTalosAPIUnavailable = facts.ReasonTalosAPIUnavailable
	ReasonMetadataIncomplete  = facts.ReasonMetadataIncomplete
	ReasonNoNodeIP            = facts.ReasonNoNodeIP
	ReasonTransformFailed     = facts.ReasonTransformFailed
	ReasonNodeIPMismatch      = "ProvidedNodeIPNotFound"
	ReasonProviderIDMismatch  = facts.ReasonProviderIDMismatch
	ReasonInitFailed          = "InitializationFailed"
	ReasonRulesReconciled     = "TransformationsReconciled"
	ReasonIdentityMismatch    = facts.ReasonIdentityMismatch
	ReasonProvidedIPInvalid   = facts.ReasonProvidedIPInvalid
	ReasonPlatformLabelKept   = "PlatformLabelKept"
)

// FactSource establishes node facts (ccm/facts.Source): a fresh lookup for
// every initialization and refresh. What it remembers of deleted nodes is
// its own to forget (facts.Source.ForgetDeleted).
type FactSource interface {
	Facts(ctx context.Context, node *corev1.Node) (*facts.Facts, error)
}

// Options tune the controller.
type Options struct {
	// Workers is the number of nodes written concurrently. Twice as many
	// nodes are synced at once: a node's Talos lookup (a network round trip,
	// or up to the lookup timeout for a node that does not answer) overlaps
	// the writes of others instead of holding a writer idle, so the API
	// server sees Workers writers, as from a controller that only writes.
	Workers int
	// StatusUpdateFrequency is how often initialized nodes' facts are re-read.
	StatusUpdateFrequency time.Duration
	// Enforce keeps rule output reconciled on initialized nodes and removes what
	// a rule no longer produces (owned keys are recorded in an annotation).
	Enforce bool
	// InitializedEvents records a Normal event per initialized node. Off by
	// default: at scale it is one more API write per node (a third of the
	// writes); the log line and the talos_ccm_nodes_initialized_total metric
	// carry the same information. Warnings are always recorded.
	InitializedEvents bool
}

// Controller initializes nodes.
type Controller struct {
	client   kubernetes.Interface
	lister   corelisters.NodeLister
	loop     *controlloop.Loop
	facts    FactSource
	recorder record.EventRecorder
	opts     Options
	lastRead sync.Map // node name -> time.Time of the last facts read
	mismatch mismatched
	// writers holds one token per node being written (Options.Workers).
	writers chan struct{}
}

// New creates the controller and registers its informer handlers.
func New(client kubernetes.Interface, nodes coreinformers.NodeInformer, source FactSource, recorder record.EventRecorder, opts Options) (*Controller, error) {
	const op = "cloudnode.New"
	if opts.StatusUpdateFrequency <= 0 {
		opts.StatusUpdateFrequency = 5 * time.Minute
	}
	c := &Controller{
		client:   client,
		lister:   nodes.Lister(),
		facts:    source,
		recorder: recorder,
		opts:     opts,
		writers:  make(chan struct{}, max(opts.Workers, 1)),
	}
	var err error
	c.loop, err = controlloop.New(controlloop.Config{
		Name: names.CloudNodeController, Kind: "node", Workers: 2 * opts.Workers,
		BaseDelay: 500 * time.Millisecond, MaxDelay: 2 * time.Minute,
		Sync:   c.sync,
		Synced: []cache.InformerSynced{nodes.Informer().HasSynced},
		// every failure to initialize is a Warning event on the node already
		FailureVerbosity: 2,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	_, err = nodes.Informer().AddEventHandlerWithResyncPeriod(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, n any) { c.enqueue(n) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				c.lastRead.Delete(n.Name)
				c.mismatch.set(n.Name, false)
			}
		},
	}, opts.StatusUpdateFrequency)
	if err != nil {
		return nil, fmt.Errorf("%s: watch nodes: %w", op, err)
	}
	watchUninitialized(c.lister)
	return c, nil
}

func (c *Controller) enqueue(obj any) {
	if n, ok := obj.(*corev1.Node); ok {
		c.loop.Add(n.Name)
	}
}

// Run processes nodes until ctx is done and returns once its workers have
// finished.
func (c *Controller) Run(ctx context.Context) {
	klog.InfoS("Starting controller", "controller", names.CloudNodeController, "workers", 2*c.opts.Workers, "writers", c.opts.Workers, "enforce", c.opts.Enforce)
	defer klog.InfoS("Stopped controller", "controller", names.CloudNodeController)
	c.loop.Run(ctx)
}

func isUninitialized(n *corev1.Node) bool { return names.Uninitialized(n.Spec.Taints) }

func (c *Controller) sync(ctx context.Context, name string) error {
	node, err := c.lister.Get(name)
	if apierrors.IsNotFound(err) {
		c.mismatch.set(name, false)
		return nil
	}
	if err != nil {
		return err
	}
	if isUninitialized(node) {
		err := c.initialize(ctx, node)
		c.mismatch.set(name, errors.Is(err, facts.ErrProviderIDMismatch))
		return err
	}
	c.mismatch.set(name, false)
	return c.refresh(ctx, node)
}

// reasonFor maps a facts error to an event reason.
func reasonFor(err error) string {
	if r := facts.Reason(err); r != "" {
		return r
	}
	return ReasonInitFailed
}

func (c *Controller) initialize(ctx context.Context, node *corev1.Node) error {
	const op = "cloudnode/Controller.initialize"
	f, err := c.facts.Facts(ctx, node)
	var mismatch *facts.ProviderIDMismatchError
	if errors.As(err, &mismatch) {
		// A kubelet may register with any providerID: it is no proof. The node
		// keeps the uninitialized taint, gets no label, address or rule output
		// of ours, and is retried with back-off until an admin resolves it (the
		// node is recreated without that providerID) or Talos agrees.
		c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonProviderIDMismatch,
			"Node kept uninitialized: it was registered with providerID %q but its Talos API establishes %q; delete the Node so that its kubelet registers it again without a providerID, or correct the platform metadata (docs/troubleshooting.md)",
			mismatch.Registered, mismatch.Established)
		return fmt.Errorf("%s: %w", op, err)
	}
	if err != nil {
		// an unreachable Talos API is reported by the facts source's observer
		// (ccm/reach): once, with where and why, not on every retry
		if !errors.Is(err, facts.ErrTalosAPI) {
			c.recorder.Eventf(node, corev1.EventTypeWarning, reasonFor(err), "Cannot initialize node yet: %v", err)
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := checkProvidedIP(node, f.Addresses); err != nil {
		c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonNodeIPMismatch, "Provided node IP is not among the addresses from the Talos API: %v", err)
		return fmt.Errorf("%s: node %s: %w", op, node.Name, err)
	}
	addrs := f.Addresses

	release, err := c.writer(ctx)
	if err != nil {
		return fmt.Errorf("%s: node %s: %w", op, node.Name, err)
	}
	defer release()
	updated := node.DeepCopy()
	for attempt := 0; ; attempt++ {
		applyFacts(updated, f, c.opts.Enforce)
		if err = c.update(ctx, updated); err == nil {
			break
		}
		if !apierrors.IsConflict(err) || attempt >= 3 {
			c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonInitFailed, "Update failed: %v", err)
			return fmt.Errorf("%s: update node %s: %w", op, node.Name, err)
		}
		// a kubelet heartbeat raced us: start from the server's copy
		if updated, err = c.client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("%s: get node %s: %w", op, node.Name, err)
		}
		if !isUninitialized(updated) {
			return nil
		}
		if updated.Spec.ProviderID != "" && updated.Spec.ProviderID != f.ProviderID {
			// set meanwhile by someone else: decided on the next sync
			return fmt.Errorf("%s: node %s: providerID %q set meanwhile: %w", op, node.Name, updated.Spec.ProviderID, facts.ErrProviderIDMismatch)
		}
	}
	if err := c.writeAddresses(ctx, updated, addrs); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	c.markRead(node.Name, f.ReadAt)
	observeInitialized(updated, f.Platform)
	if c.opts.InitializedEvents {
		c.recorder.Eventf(updated, corev1.EventTypeNormal, ReasonInitialized, "Initialized from the Talos API: platform=%s providerID=%s rules=%v",
			f.Platform, updated.Spec.ProviderID, f.Rules)
	}
	klog.InfoS("Initialized node", "node", klog.KObj(updated), "platform", f.Platform, "providerID", updated.Spec.ProviderID, "rules", f.Rules)
	return nil
}

// writeAddresses sets status.addresses with one merge patch of that field
// alone: the node in hand may be the informer's copy, which holds no other
// status (ccm/app keeps only the addresses of a Node's status in the cache),
// so a status update from it would erase what the kubelet reports.
func (c *Controller) writeAddresses(ctx context.Context, node *corev1.Node, addrs []corev1.NodeAddress) error {
	if slices.Equal(node.Status.Addresses, addrs) {
		return nil
	}
	patch, err := addressesPatch(addrs)
	if err != nil {
		return fmt.Errorf("addresses of node %s: %w", node.Name, err)
	}
	err = c.client.CoreV1().RESTClient().Patch(types.MergePatchType).Resource("nodes").Name(node.Name).SubResource("status").
		Body(patch).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("update addresses of node %s: %w", node.Name, err)
	}
	return nil
}

// update writes n (an update of the Node, not its status) and does not decode
// the API server's answer: talos-ccm reads nothing from the Node as stored (the
// informer brings it), and decoding it and the status patch's answer, managed
// fields and all, was 8 % of what talos-ccm allocated while initializing 5,000
// nodes. n keeps the resourceVersion it was sent with.
func (c *Controller) update(ctx context.Context, n *corev1.Node) error {
	return c.client.CoreV1().RESTClient().Put().Resource("nodes").Name(n.Name).Body(n).Do(ctx).Error()
}

// addressesPatch is a JSON merge patch replacing status.addresses as a whole
// (a merge patch replaces lists; the strategic merge key of addresses, type,
// is not unique).
func addressesPatch(addrs []corev1.NodeAddress) ([]byte, error) {
	if addrs == nil {
		addrs = []corev1.NodeAddress{}
	}
	return json.Marshal(map[string]any{"status": map[string]any{"addresses": addrs}})
}

// applyFacts writes everything of f onto n and removes the uninitialized taint.
func applyFacts(n *corev1.Node, f *facts.Facts, enforce bool) {
	if n.Spec.ProviderID == "" {
		n.Spec.ProviderID = f.ProviderID
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	// f.Labels is cloud.NodeLabels: rule labels, instance type, topology,
	// platform, cluster name, lifecycle (what `hybridctl transform explain` shows)
	maps.Copy(n.Labels, f.Labels)
	if len(f.Annotations) > 0 {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		maps.Copy(n.Annotations, f.Annotations)
	}
	taints := n.Spec.Taints[:0:0]
	for _, t := range n.Spec.Taints {
		if t.Key != names.UninitializedTaint {
			taints = append(taints, t)
		}
	}
	for _, t := range f.Taints {
		if !slices.ContainsFunc(taints, func(x corev1.Taint) bool { return x.Key == t.Key && x.Effect == t.Effect }) {
			taints = append(taints, t)
		}
	}
	n.Spec.Taints = taints
	if enforce && f.Result != nil {
		transform.Plan(n, f.Result).Apply(n)
	}
}

// refresh re-reads facts of an initialized node at most once per
// StatusUpdateFrequency and writes what changed: addresses, and in enforce
// mode the rule output.
func (c *Controller) refresh(ctx context.Context, node *corev1.Node) error {
	const op = "cloudnode/Controller.refresh"
	if last, ok := c.lastReadAt(node.Name); ok && time.Since(last) < c.opts.StatusUpdateFrequency {
		return nil
	}
	f, err := c.facts.Facts(ctx, node)
	if err != nil {
		// An initialized node keeps what it has and is read again at the
		// next StatusUpdateFrequency. The exception, in enforce mode, is a
		// node without the routing label (one another CCM initialized): no
		// native CCM sees it until a read gives it the label, so it is
		// retried with back-off, as a node that failed to initialize is,
		// instead of waiting for the informer's next resync. Routed nodes
		// whose Talos API is down (an outage) are not retried sooner than
		// before. An unreachable Talos API is reported by the facts source's
		// observer (ccm/reach), not here.
		if c.opts.Enforce && node.Labels[names.PlatformLabel] == "" {
			return fmt.Errorf("%s: node %s has no %s label yet: %w", op, node.Name, names.PlatformLabel, err)
		}
		klog.V(2).InfoS("Cannot refresh node facts", "node", klog.KObj(node), "err", err)
		return nil
	}
	// The read counts (refresh waits StatusUpdateFrequency for the next)
	// once what it gave is on the Node: a write that fails is retried with
	// back-off, and the retry reads and writes again.
	if c.opts.Enforce && f.PlatformHeld != "" {
		c.recorder.Eventf(node, corev1.EventTypeWarning, ReasonPlatformLabelKept, "Platform label kept: %s", f.PlatformHeld)
	}
	var change transform.NodeChange
	enforce := c.opts.Enforce && f.Result != nil
	if enforce {
		change = transform.Plan(node, f.Result)
	}
	if (!enforce || change.Empty()) && slices.Equal(node.Status.Addresses, f.Addresses) {
		c.markRead(node.Name, f.ReadAt)
		return nil // nothing to write: no writer token taken
	}
	release, err := c.writer(ctx)
	if err != nil {
		return fmt.Errorf("%s: node %s: %w", op, node.Name, err)
	}
	defer release()
	if enforce && !change.Empty() {
		n := node.DeepCopy()
		change.Apply(n)
		if err := c.update(ctx, n); err != nil {
			return fmt.Errorf("%s: node %s: %w", op, node.Name, err)
		}
		c.recorder.Eventf(n, corev1.EventTypeNormal, ReasonRulesReconciled, "Rule output reconciled: %s", change)
		node = n
	}
	if err := checkProvidedIP(node, f.Addresses); err != nil {
		klog.V(2).InfoS("Provided node IP not among Talos addresses", "node", klog.KObj(node), "err", err)
		c.markRead(node.Name, f.ReadAt)
		return nil
	}
	if err := c.writeAddresses(ctx, node, f.Addresses); err != nil {
		return err
	}
	c.markRead(node.Name, f.ReadAt)
	return nil
}

// writer waits for one of the Options.Workers writer tokens and returns its
// release, or ctx's error when ctx ends first.
func (c *Controller) writer(ctx context.Context) (func(), error) {
	select {
	case c.writers <- struct{}{}:
		return func() { <-c.writers }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *Controller) lastReadAt(name string) (time.Time, bool) {
	v, ok := c.lastRead.Load(name)
	if !ok {
		return time.Time{}, false
	}
	return v.(time.Time), true
}

func (c *Controller) markRead(name string, t time.Time) { c.lastRead.Store(name, t) }

// checkProvidedIP verifies that every IP the kubelet was told to use is among
// the addresses established from the Talos API (the same rule the upstream node
// controller applies before it removes the taint). Ordering stays ours: the
// provided IPs are the InternalIPs, preferred family first.
func checkProvidedIP(node *corev1.Node, addrs []corev1.NodeAddress) error {
	ip, ok := node.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr]
	if !ok {
		return nil
	}
	_, err := cloudnodeutil.GetNodeAddressesFromNodeIP(ip, addrs)
	return err
}
