// Package reach makes a node whose Talos API talos-ccm cannot reach loud.
// talos-ccm reads every node's Talos API through a Talos API endpoint (a
// control plane's apid), which forwards each request to the node's address,
// port 50000: across clouds that needs a path from the control planes to
// every node (KubeSpan, or routing). A Reporter learns the outcome of every
// lookup of a node's facts (it is the ccm/facts Source's Observer) and says
// what it knows:
//
//   - a Warning event TalosAPIUnavailable on the Node naming the address
//     dialled, the endpoint that took the request (when one did), where the
//     request stopped and why, in words, with the same as annotations of the
//     event (names.TalosAPIAddressAnnotation and the others) for tools
//     (hybridctl doctor). It is recorded when the node becomes unreachable,
//     when where or why changes, and again every Options.Repeat while it
//     lasts (the client-go recorder counts the repetitions on one event),
//     never on every retry;
//   - a Normal event TalosAPIAvailable when the node answers again;
//   - talos_ccm_talos_api_unreachable_nodes{hop,cause}, the nodes
//     unreachable now, and talos_ccm_talos_api_unreachable_lookups_total{hop,cause},
//     the lookups that failed; both labels from fixed sets (talos.Hops,
//     talos.Causes).
//
// It never calls the Talos API itself and writes nothing but events.
package reach

import (
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/safetext"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
)

// Component is the source component of the events.
const Component = "talos-ccm"

// Event reasons on Nodes.
const (
	// ReasonUnavailable: the node's Talos API cannot be reached (the reason
	// every talos-ccm controller used for it before).
	ReasonUnavailable = facts.ReasonTalosAPIUnavailable
	// ReasonAvailable: it answers again.
	ReasonAvailable = "TalosAPIAvailable"
)

// DefaultRepeat is how often the Warning of a node that stays unreachable is
// recorded again when Options.Repeat is zero: well within the API server's
// event TTL (1 h by default), so that the event stays while the trouble
// does, and readers (hybridctl doctor) can tell a current one from one that
// is over.
const DefaultRepeat = 10 * time.Minute

// Options tune a Reporter.
type Options struct {
	// Repeat: a node unreachable for the same reason gets its Warning again
	// after this long (zero: DefaultRepeat).
	Repeat time.Duration
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

// Reporter keeps the nodes whose Talos API is unreachable. Use one per
// process, as the Observer of the process' facts Source.
type Reporter struct {
	repeat time.Duration
	now    func() time.Time

	mu       sync.Mutex
	recorder record.EventRecorder
	nodes    map[string]*state
}

// state is what a Reporter keeps of an unreachable node.
type state struct {
	failure talos.Failure
	since   time.Time
	// warned is when the Warning was last recorded (zero: not yet).
	warned time.Time
}

var _ facts.Observer = (*Reporter)(nil)

// New returns a Reporter. It records no event until SetRecorder.
func New(o Options) *Reporter {
	register()
	if o.Repeat <= 0 {
		o.Repeat = DefaultRepeat
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Reporter{repeat: o.Repeat, now: o.Now, nodes: map[string]*state{}}
}

// SetRecorder sets the recorder events go through; the first one set stays.
func (r *Reporter) SetRecorder(rec record.EventRecorder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.recorder == nil {
		r.recorder = rec
	}
}

// key is what makes a failure another one: the address, the hop and the
// cause. Not the endpoint: requests go to the control planes in turn.
func key(f talos.Failure) string { return f.Node + "|" + string(f.Hop) + "|" + string(f.Cause) }

// Unreachable records that no address of node answered; failures[0] is the
// first address dialled (the preferred family).
func (r *Reporter) Unreachable(node *corev1.Node, failures []talos.Failure) {
	if len(failures) == 0 {
		return
	}
	f := failures[0]
	now := r.now()
	for _, x := range failures {
		lookupsFailed.WithLabelValues(string(x.Hop), string(x.Cause)).Inc()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.nodes[node.Name]
	changed := st == nil || key(st.failure) != key(f)
	switch {
	case st == nil:
		st = &state{since: now}
		r.nodes[node.Name] = st
		unreachableNodes.WithLabelValues(string(f.Hop), string(f.Cause)).Inc()
		klog.InfoS("Talos API of node unreachable", "node", klog.KObj(node), "address", f.Node, "endpoint", f.Endpoint, "hop", f.Hop, "cause", f.Cause, "err", f.Err)
	case changed:
		unreachableNodes.WithLabelValues(string(st.failure.Hop), string(st.failure.Cause)).Dec()
		unreachableNodes.WithLabelValues(string(f.Hop), string(f.Cause)).Inc()
		klog.InfoS("Talos API of node still unreachable, another way", "node", klog.KObj(node), "address", f.Node, "endpoint", f.Endpoint, "hop", f.Hop, "cause", f.Cause, "err", f.Err)
	}
	st.failure = f
	if r.recorder == nil || (!changed && !st.warned.IsZero() && now.Sub(st.warned) < r.repeat) {
		return
	}
	st.warned = now
	ann := map[string]string{
		names.TalosAPIAddressAnnotation: f.Node,
		names.TalosAPIHopAnnotation:     string(f.Hop),
		names.TalosAPICauseAnnotation:   string(f.Cause),
	}
	if f.Endpoint != "" {
		ann[names.TalosAPIEndpointAnnotation] = f.Endpoint
	}
	r.recorder.AnnotatedEventf(node, ann, corev1.EventTypeWarning, ReasonUnavailable, "%s", Message(failures))
}

// Message is the Warning's message for failures (the first address dialled
// first): where and why, the gRPC error, and where to read on.
func Message(failures []talos.Failure) string {
	var b strings.Builder
	f := failures[0]
	fmt.Fprintf(&b, "Talos API unreachable (%s/%s): %s.", f.Hop, f.Cause, f.Describe())
	for _, x := range failures[1:] {
		fmt.Fprintf(&b, " Also %s (%s/%s).", x.Node, x.Hop, x.Cause)
	}
	// the answering apid chose the words of the error
	fmt.Fprintf(&b, " Error: %s.", safetext.Clip(errText(f.Err), 300))
	if f.Hop == talos.HopNode {
		fmt.Fprintf(&b, " The control planes need a path to every node's Talos API, port %s (KubeSpan or routing).", talos.Port)
	}
	b.WriteString(` See docs/troubleshooting.md, "The Talos API of a node cannot be reached".`)
	return b.String()
}

func errText(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}

// Reached records that node's Talos API answered.
func (r *Reporter) Reached(node *corev1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.nodes[node.Name]
	if st == nil {
		return
	}
	delete(r.nodes, node.Name)
	unreachableNodes.WithLabelValues(string(st.failure.Hop), string(st.failure.Cause)).Dec()
	down := r.now().Sub(st.since).Round(time.Second)
	klog.InfoS("Talos API of node reachable again", "node", klog.KObj(node), "address", st.failure.Node, "unreachableFor", down)
	if r.recorder != nil && !st.warned.IsZero() {
		r.recorder.AnnotatedEventf(node, map[string]string{names.TalosAPIAddressAnnotation: st.failure.Node}, corev1.EventTypeNormal, ReasonAvailable,
			"Talos API answers again (unreachable for %s: %s/%s at %s)", down, st.failure.Hop, st.failure.Cause, st.failure.Node)
	}
}

// Forget drops a deleted node.
func (r *Reporter) Forget(nodeName string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.nodes[nodeName]; st != nil {
		delete(r.nodes, nodeName)
		unreachableNodes.WithLabelValues(string(st.failure.Hop), string(st.failure.Cause)).Dec()
	}
}

// Nodes are the nodes unreachable now, by name, with the failure of the
// first address dialled.
func (r *Reporter) Nodes() map[string]talos.Failure {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]talos.Failure, len(r.nodes))
	for n, st := range r.nodes {
		out[n] = st.failure
	}
	return out
}
