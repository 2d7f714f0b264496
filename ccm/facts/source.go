package facts

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/iplist"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// TalosReader is what a Source reads from the Talos API (ccm/talos.Client),
// each request addressed to one node IP.
type TalosReader interface {
	PlatformMetadata(ctx context.Context, node string) (*talos.PlatformMetadata, error)
	Addresses(ctx context.Context, node string) ([]talos.Address, error)
	Links(ctx context.Context, node string) ([]talos.Link, error)
	SystemInformation(ctx context.Context, node string) (*talos.SystemInformation, error)
	Nodename(ctx context.Context, node string) (string, error)
}

var _ TalosReader = (*talos.Client)(nil)

// Interpreter decides what a reading means for Kubernetes (ccm/cloud, with
// the transformation rules).
type Interpreter interface {
	// PreferIPv6 tells which family of the node IPs is dialled first.
	PreferIPv6() bool
	// NeedsSystemInformation tells whether hardware/SystemInformation is read.
	NeedsSystemInformation() bool
	// Interpret derives the facts from a reading of node's Talos API. Its
	// errors wrap ErrRules or ErrMetadataIncomplete. It must not modify node
	// (the shared informer copy) nor keep r.
	Interpret(node *corev1.Node, r *Reading) (*Facts, error)
}

// Options tune a Source.
type Options struct {
	// LookupTimeout bounds one lookup of a node's facts as a whole (every
	// address tried, every request). Zero means DefaultLookupTimeout.
	LookupTimeout time.Duration
	// DepartedHold is how long the addresses of a forgotten node (deleted, or
	// no longer proven) are still named by Holders. Zero means
	// DefaultDepartedHold.
	DepartedHold time.Duration
	// Observer, when set, learns how every lookup ended (ccm/reach reports
	// nodes whose Talos API cannot be reached).
	Observer Observer
}

// Observer learns, after each lookup of a node's facts, whether its Talos API
// answered. It is called from the lookup's goroutine, once per lookup
// (however many callers joined it), with the Source's lock held: it must not
// block nor call the Source. A lookup that ends after the node was deleted
// (Source.Deleted) is not observed.
type Observer interface {
	// Reached: the node's Talos API answered (the answer may still have
	// been refused: metadata incomplete, another machine, rules failed).
	Reached(node *corev1.Node)
	// Unreachable: no address of the node answered; failures are those of
	// each address dialled, in the order dialled (at least one).
	Unreachable(node *corev1.Node, failures []talos.Failure)
	// Forget: the node was deleted.
	Forget(nodeName string)
}

// DefaultDepartedHold: a deleted node's machine may still carry its
// addresses for a while (it is being reinstalled, or comes back under the
// same name); no other node gets a certificate for them meanwhile.
const DefaultDepartedHold = time.Hour

// DefaultLookupTimeout bounds a lookup when Options.LookupTimeout is zero.
const DefaultLookupTimeout = 20 * time.Second

// Source establishes node facts and remembers them. Use one per process: its
// single-flight and its memory are what every controller shares.
type Source struct {
	talos    TalosReader
	interp   Interpreter
	lookup   time.Duration
	observer Observer

	// watching registers the delete handler of ForgetDeleted once.
	watching    sync.Once
	watchingErr error

	mu       sync.Mutex
	facts    map[string]*Facts  // by node name
	inflight map[string]*flight // by node name: the one lookup of each node in progress
	// holders indexes the remembered facts' addresses (IPs in canonical form,
	// names in lower case) by the nodes they were established for; departed
	// keeps the addresses of forgotten nodes until their hold has passed.
	holders  map[string]map[string]bool
	departed map[string]departedNode
	hold     time.Duration
	// looked are the nodes whose lookup ended since the Source started
	// (answered or not).
	looked map[string]bool
}

// departedNode is what a Source keeps of a forgotten node.
type departedNode struct {
	addresses []string
	until     time.Time
}

// flight is one lookup of a node's facts in progress. Every caller asking for
// the same node meanwhile (cloud-node, node-csr-approval, node IPAM) waits for
// it instead of dialling the node again: a node whose Talos API hangs costs
// one lookup.
type flight struct {
	done chan struct{}
	f    *Facts
	err  error
	// deleted: the node was deleted while the lookup was in flight (Deleted);
	// its outcome is neither remembered nor observed. Guarded by Source.mu.
	deleted bool
}

// NewSource returns a Source reading through r and interpreting with in.
func NewSource(r TalosReader, in Interpreter, opts Options) *Source {
	if opts.LookupTimeout <= 0 {
		opts.LookupTimeout = DefaultLookupTimeout
	}
	if opts.DepartedHold <= 0 {
		opts.DepartedHold = DefaultDepartedHold
	}
	return &Source{talos: r, interp: in, lookup: opts.LookupTimeout, observer: opts.Observer, facts: map[string]*Facts{}, inflight: map[string]*flight{},
		holders: map[string]map[string]bool{}, departed: map[string]departedNode{}, hold: opts.DepartedHold, looked: map[string]bool{}}
}

// Facts establishes the node's facts afresh from its Talos API (joining the
// node's lookup in flight, if any) and remembers them. The lookup runs under
// its own deadline (Options.LookupTimeout) whatever the callers' contexts; a
// caller whose context ends stops waiting, the lookup goes on for the others.
// An uninitialized node whose providerID is set and differs from the
// established one gets ErrProviderIDMismatch (a *ProviderIDMismatchError
// naming both), and nothing is remembered for it. The returned Facts are
// shared: callers must not modify them.
func (s *Source) Facts(ctx context.Context, node *corev1.Node) (*Facts, error) {
	const op = "facts/Source.Facts"
	targets, err := NodeIPs(node, s.interp.PreferIPv6())
	if err != nil {
		return nil, fmt.Errorf("%s: node %s: %w", op, node.Name, err)
	}
	s.mu.Lock()
	fl := s.inflight[node.Name]
	if fl == nil {
		fl = &flight{done: make(chan struct{})}
		s.inflight[node.Name] = fl
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.lookup)
		go func() {
			defer cancel()
			fl.f, fl.err = s.read(lctx, node, targets)
			s.mu.Lock()
			// Under s.mu, so that Deleted either comes after (and its
			// Observer.Forget undoes this) or marked the flight before: a
			// node deleted during its lookup is not left behind as
			// unreachable (nor remembered) with no delete event to come.
			if !fl.deleted {
				s.observe(node, fl.err)
			}
			delete(s.inflight, node.Name)
			if !fl.deleted {
				s.looked[node.Name] = true
			}
			switch {
			case fl.deleted, fl.err != nil:
			case providerIDMismatch(node, fl.f) != nil:
				// nothing is established for a node registered with another providerID
				s.setLocked(node.Name, nil)
			default:
				s.setLocked(node.Name, fl.f.remembered())
			}
			s.mu.Unlock()
			close(fl.done)
		}()
	} else {
		klog.V(4).InfoS("Joining the node's lookup in flight", "node", klog.KObj(node))
	}
	s.mu.Unlock()
	select {
	case <-fl.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: node %s: %w", op, node.Name, ctx.Err())
	}
	if fl.err != nil {
		return nil, fl.err
	}
	if err := providerIDMismatch(node, fl.f); err != nil {
		return nil, fmt.Errorf("%s: node %s: %w", op, node.Name, err)
	}
	return fl.f, nil
}

// Established returns the facts remembered for the node, or establishes them
// (Facts) when there are none. What is remembered of a node is its identity
// and addresses only (Platform, ProviderID, Addresses, TalosAddresses,
// ReadAt): what node-csr-approval and node IPAM read; labels, rule output and
// the rest are written to the Node and not kept. Its errors are those of Facts: ErrIdentity
// (the machine that answered is provably another node) and ErrProvidedNodeIP
// (nothing was dialled) are not cured by waiting.
func (s *Source) Established(ctx context.Context, node *corev1.Node) (*Facts, error) {
	s.mu.Lock()
	f := s.facts[node.Name]
	s.mu.Unlock()
	if f != nil {
		return f, nil
	}
	return s.Facts(ctx, node)
}

// Remembered returns the facts remembered for the node, if any, without
// reading its Talos API (what Established returns first). The Facts are
// shared: callers must not modify them.
func (s *Source) Remembered(nodeName string) (*Facts, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.facts[nodeName]
	return f, f != nil
}

// Forget drops the facts remembered for a node (deleted, or no longer
// proven to be the machine that answers on its address).
// Its addresses stay named by Holders for Options.DepartedHold.
func (s *Source) Forget(nodeName string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.facts[nodeName]; f != nil {
		s.departed[nodeName] = departedNode{addresses: addressKeys(f.Addresses), until: time.Now().Add(s.hold)}
	}
	s.setLocked(nodeName, nil)
	delete(s.looked, nodeName)
}

// Deleted forgets a node that was deleted (Forget), and tells the Observer.
func (s *Source) Deleted(nodeName string) {
	s.mu.Lock()
	if fl := s.inflight[nodeName]; fl != nil {
		fl.deleted = true
	}
	s.mu.Unlock()
	s.Forget(nodeName)
	if s.observer != nil {
		s.observer.Forget(nodeName)
	}
}

// ForgetDeleted calls Deleted for every node the informer sees deleted. Every
// controller that looks nodes up calls it with the process's shared node
// informer; the handler is registered once, whichever of them runs: with
// cloud-node disabled (--controllers=node-csr-approval), a deleted node's
// facts, its addresses as a current holder and its unreachable gauge would
// otherwise stay for as long as the process runs.
func (s *Source) ForgetDeleted(nodes cache.SharedInformer) error {
	s.watching.Do(func() {
		_, s.watchingErr = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
			DeleteFunc: func(obj any) {
				if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				if n, ok := obj.(*corev1.Node); ok {
					s.Deleted(n.Name)
				}
			},
		})
	})
	if s.watchingErr != nil {
		return fmt.Errorf("facts: forget deleted nodes: %w", s.watchingErr)
	}
	return nil
}

// observe tells the Observer how a lookup ended: the node's Talos API
// answered (whatever the answer meant), or it did not (a *TalosAPIError).
func (s *Source) observe(node *corev1.Node, err error) {
	if s.observer == nil {
		return
	}
	var te *TalosAPIError
	switch {
	case errors.As(err, &te):
		if len(te.Failures) > 0 {
			s.observer.Unreachable(node, te.Failures)
		}
	case err == nil, errors.Is(err, ErrMetadataIncomplete), errors.Is(err, ErrIdentity), errors.Is(err, ErrRules):
		s.observer.Reached(node)
	}
}

// Looked reports whether a lookup of the node has ended since the Source
// started, answered or not: whatever the node's own status lists, Holders
// then says all talos-ccm knows it holds.
func (s *Source) Looked(nodeName string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.looked[nodeName]
}

// Holders tells for which nodes talos-ccm established address (an IP, or a
// DNS name): current ones (remembered facts) and ones forgotten within
// Options.DepartedHold (departed). Both are sorted.
func (s *Source) Holders(address string) (current, departed []string) {
	key := AddressKey(address)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.holders[key] {
		current = append(current, name)
	}
	for name, d := range s.departed {
		switch {
		case now.After(d.until):
			delete(s.departed, name)
		case s.facts[name] == nil && slices.Contains(d.addresses, key):
			departed = append(departed, name)
		}
	}
	slices.Sort(current)
	slices.Sort(departed)
	return current, departed
}

// AddressKey is the form in which Holders compares addresses: an IP in its
// canonical form (IPv4-mapped IPv6 as IPv4), a name in lower case.
func AddressKey(address string) string {
	if ip, err := netip.ParseAddr(address); err == nil {
		return ip.Unmap().WithZone("").String()
	}
	return strings.ToLower(strings.TrimSuffix(address, "."))
}

func addressKeys(addrs []corev1.NodeAddress) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if a.Address != "" {
			out = append(out, AddressKey(a.Address))
		}
	}
	return out
}

// setLocked remembers f for the node (nil: forgets it) and keeps holders in
// step. s.mu is held.
func (s *Source) setLocked(nodeName string, f *Facts) {
	if old := s.facts[nodeName]; old != nil {
		for _, k := range addressKeys(old.Addresses) {
			delete(s.holders[k], nodeName)
			if len(s.holders[k]) == 0 {
				delete(s.holders, k)
			}
		}
	}
	if f == nil {
		delete(s.facts, nodeName)
		return
	}
	s.facts[nodeName] = f
	delete(s.departed, nodeName)
	for _, k := range addressKeys(f.Addresses) {
		if s.holders[k] == nil {
			s.holders[k] = map[string]bool{}
		}
		s.holders[k][nodeName] = true
	}
}

// providerIDMismatch refuses an uninitialized node registered with a providerID
// that differs from the established one: a kubelet can register with any
// providerID, so it proves nothing. An initialized node's providerID was
// accepted when it was initialized and is write-once; it is not compared again
// (on metal it names the address that answered, which may change).
func providerIDMismatch(node *corev1.Node, f *Facts) error {
	if node.Spec.ProviderID == "" || node.Spec.ProviderID == f.ProviderID || !uninitialized(node) {
		return nil
	}
	return &ProviderIDMismatchError{Registered: node.Spec.ProviderID, Established: f.ProviderID}
}

func uninitialized(node *corev1.Node) bool { return names.Uninitialized(node.Spec.Taints) }

// NeedsLinks reports whether network/LinkStatus matters for addrs: only an
// address that may become an ExternalIP (on the platform's "external" link, or
// a public one) is judged by the link that holds it. A node with private
// addresses only costs no extra Talos round trip.
func NeedsLinks(addrs []talos.Address) bool {
	for _, a := range addrs {
		ip := a.Prefix.Addr()
		if a.Link == "external" || (ip.IsGlobalUnicast() && !ip.IsPrivate()) {
			return true
		}
	}
	return false
}

// read reads the node's Talos API at targets (in order, until one answers as
// the node) and interprets the reading. It neither remembers nor compares the
// result.
func (s *Source) read(ctx context.Context, node *corev1.Node, targets []netip.Addr) (*Facts, error) {
	const op = "facts/Source.Facts"
	// Metadata, addresses and identity are independent reads: run them
	// concurrently so a node costs one Talos round trip of latency.
	var (
		r        = &Reading{NodeIPs: targets}
		errs     []error
		needSys  = s.interp.NeedsSystemInformation()
		readTime = time.Now()
	)
	for _, ip := range targets {
		var wg sync.WaitGroup
		var md *talos.PlatformMetadata
		var addrs []talos.Address
		var sys *talos.SystemInformation
		var mdErr, addrErr, sysErr, nameErr error
		var nodename string
		wg.Go(func() { md, mdErr = s.talos.PlatformMetadata(ctx, ip.String()) })
		wg.Go(func() { addrs, addrErr = s.talos.Addresses(ctx, ip.String()) })
		if needSys {
			wg.Go(func() { sys, sysErr = s.talos.SystemInformation(ctx, ip.String()) })
		}
		// the last read on this goroutine: one goroutine fewer whose stack
		// grows to a gRPC call's depth, per node
		nodename, nameErr = s.talos.Nodename(ctx, ip.String())
		wg.Wait()
		// The kubelet writes provided-node-ip itself: whoever answers there must
		// prove to be this node before anything it says is believed.
		if nameErr == nil && nodename != node.Name {
			// What was proven before no longer holds: no consumer may go on
			// accepting the remembered facts.
			s.Forget(node.Name)
			return nil, fmt.Errorf("%s: node %s: %w: the Talos API at %s belongs to node %q", op, node.Name, ErrIdentity, ip, nodename)
		}
		if nameErr == nil && mdErr == nil && addrErr == nil && (sysErr == nil || errors.Is(sysErr, talos.ErrNotFound)) {
			r.Answered, r.Metadata, r.Addresses, r.System = ip, md, addrs, sys
			break
		}
		if errors.Is(mdErr, talos.ErrNotFound) {
			return nil, fmt.Errorf("%s: node %s: %w: the node has no PlatformMetadata resource yet", op, node.Name, ErrMetadataIncomplete)
		}
		errs = append(errs, errors.Join(mdErr, addrErr, sysErr, nameErr))
		if ctx.Err() != nil {
			break
		}
	}
	if !r.Answered.IsValid() {
		return nil, &TalosAPIError{Failures: failures(errs),
			err: fmt.Errorf("%s: node %s: %w at %s: %w", op, node.Name, ErrTalosAPI, iplist.Join(targets), errors.Join(errs...))}
	}
	if NeedsLinks(r.Addresses) {
		links, err := s.talos.Links(ctx, r.Answered.String())
		if err != nil {
			return nil, &TalosAPIError{Failures: failures([]error{err}),
				err: fmt.Errorf("%s: node %s: %w at %s: %w", op, node.Name, ErrTalosAPI, r.Answered, err)}
		}
		r.Links = links
	}
	f, err := s.interp.Interpret(node, r)
	if err != nil {
		return nil, fmt.Errorf("%s: node %s: %w", op, node.Name, err)
	}
	f.TalosAddresses = r.Addresses
	f.ReadAt = readTime
	klog.V(4).InfoS("Established node facts", "node", klog.KObj(node), "platform", f.Platform, "providerID", f.ProviderID, "rules", f.Rules, "talosAddress", r.Answered)
	return f, nil
}
