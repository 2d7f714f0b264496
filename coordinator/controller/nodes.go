package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// nodeStore is the coordinator's view of the cluster's Nodes. Of a Node it
// keeps only what the NativeCCM controller reads: the name, the platform
// label and whether spec.providerID is set, and only of Nodes that have a
// platform label (about a hundred bytes a node; a Node object in an
// informer's cache costs ten times that even cut to a skeleton). Its own
// reflector lists Nodes in pages (pagedNodes) and watches them; a change that
// moves a platform's count or its nodes without providerID enqueues that
// platform's NativeCCMs. It is the controller's source of Node events and
// reports synced after the first complete list has been counted and its
// platforms enqueued, so no NativeCCM is reconciled before its nodes are
// known.
type nodeStore struct {
	lw toolscache.ListerWatcher
	// nativeCCMs lists the NativeCCMs of a platform (the manager's cache).
	nativeCCMs func(ctx context.Context, platform string) ([]string, error)

	mu        sync.RWMutex
	nodes     map[string]nodeEntry
	platforms map[string]*platformNodes
	queue     queue
	ctx       context.Context
	synced    chan struct{}
	syncOnce  sync.Once
	started   bool
}

// nodeEntry is what is kept of one Node.
type nodeEntry struct {
	// platform is the key of nodeStore.platforms (one string per platform).
	platform     string
	noProviderID bool
}

// platformNodes is one platform's nodes.
type platformNodes struct {
	// name is the platform; every nodeEntry of the platform shares it.
	name  string
	count int
	// withoutProviderID names the platform's nodes with no providerID.
	withoutProviderID map[string]struct{}
}

// platformView is what the controller reads of one platform's nodes.
type platformView struct {
	Nodes int
	// WithoutProviderID is how many of them have no providerID.
	WithoutProviderID int
	// FirstWithoutProviderID names the first shownWithoutProviderID of those
	// in name order (what the EmptyProviderID condition shows).
	FirstWithoutProviderID []string
}

// shownWithoutProviderID is how many nodes without providerID a platform's
// view names.
const shownWithoutProviderID = 5

var (
	_ toolscache.ReflectorStore                    = (*nodeStore)(nil)
	_ source.TypedSyncingSource[reconcile.Request] = (*nodeStore)(nil)
)

// newNodeStore returns a store that lists and watches Nodes with cfg (as
// protobuf) and finds a platform's NativeCCMs in c's index.
func newNodeStore(cfg *rest.Config, c client.Reader) (*nodeStore, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node store: %w", err)
	}
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return cs.CoreV1().Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().Nodes().Watch(ctx, o)
		},
	}
	s := newNodeStoreFrom(pagedNodes{lw})
	s.nativeCCMs = func(ctx context.Context, platform string) ([]string, error) {
		var list v1.NativeCCMList
		if err := c.List(ctx, &list, client.MatchingFields{platformIndex: platform}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		out := make([]string, len(list.Items))
		for i := range list.Items {
			out[i] = list.Items[i].Name
		}
		return out, nil
	}
	return s, nil
}

func newNodeStoreFrom(lw toolscache.ListerWatcher) *nodeStore {
	return &nodeStore{
		lw:        lw,
		nodes:     map[string]nodeEntry{},
		platforms: map[string]*platformNodes{},
		synced:    make(chan struct{}),
	}
}

// Start runs the store's reflector until ctx is done; changes enqueue
// NativeCCMs in q. It implements source.Source.
func (s *nodeStore) Start(ctx context.Context, q queue) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return fmt.Errorf("node store: started twice")
	}
	s.started, s.queue, s.ctx = true, q, ctx
	s.mu.Unlock()
	r := toolscache.NewReflectorWithOptions(s.lw, &corev1.Node{}, s, toolscache.ReflectorOptions{Name: "ccm-coordinator nodes"})
	go r.RunWithContext(ctx)
	return nil
}

// WaitForSync returns when the first complete list of Nodes is in the store.
func (s *nodeStore) WaitForSync(ctx context.Context) error {
	select {
	case <-s.synced:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("node store: the first list of Nodes did not complete: %w", context.Cause(ctx))
	}
}

func (s *nodeStore) String() string { return "nodes (name, platform, providerID set)" }

// platform returns the nodes of platform p.
func (s *nodeStore) platform(p string) platformView {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pn := s.platforms[p]
	if pn == nil {
		return platformView{}
	}
	v := platformView{Nodes: pn.count, WithoutProviderID: len(pn.withoutProviderID)}
	// the first few names in order, without sorting them all: a platform may
	// have thousands of nodes not initialized yet
	for n := range pn.withoutProviderID {
		first := v.FirstWithoutProviderID
		if len(first) == shownWithoutProviderID && n >= first[len(first)-1] {
			continue
		}
		i, _ := slices.BinarySearch(first, n)
		first = slices.Insert(first, i, n)
		if len(first) > shownWithoutProviderID {
			first = first[:shownWithoutProviderID]
		}
		v.FirstWithoutProviderID = first
	}
	return v
}

// entryOf reads what is kept of a Node (a *corev1.Node from a watch, a
// *nodeFacts from a list page).
func entryOf(obj any) (name string, platform string, noProviderID bool, ok bool) {
	switch n := obj.(type) {
	case *corev1.Node:
		return n.Name, n.Labels[names.PlatformLabel], n.Spec.ProviderID == "", true
	case *nodeFacts:
		return n.Name, n.Platform, !n.HasProviderID, true
	case toolscache.DeletedFinalStateUnknown:
		return entryOf(n.Obj)
	}
	return "", "", false, false
}

// set records what is kept of one node under s.mu and returns the platforms
// whose view changed.
func (s *nodeStore) set(name, platform string, noProviderID bool) []string {
	old, had := s.nodes[name]
	if had && old.platform == platform && old.noProviderID == noProviderID {
		return nil
	}
	var changed []string
	if had {
		s.remove(name, old)
		changed = append(changed, old.platform)
	}
	if platform == "" {
		return changed
	}
	pn := s.platforms[platform]
	if pn == nil {
		pn = &platformNodes{name: platform}
		s.platforms[platform] = pn
	}
	pn.count++
	if noProviderID {
		if pn.withoutProviderID == nil {
			pn.withoutProviderID = map[string]struct{}{}
		}
		pn.withoutProviderID[name] = struct{}{}
	}
	s.nodes[name] = nodeEntry{platform: pn.name, noProviderID: noProviderID}
	if !had || old.platform != platform {
		changed = append(changed, pn.name)
	}
	return changed
}

// remove forgets node name under s.mu.
func (s *nodeStore) remove(name string, e nodeEntry) {
	delete(s.nodes, name)
	pn := s.platforms[e.platform]
	if pn == nil {
		return
	}
	pn.count--
	delete(pn.withoutProviderID, name)
	if pn.count <= 0 {
		delete(s.platforms, e.platform)
	}
}

func (s *nodeStore) upsert(obj any) error {
	name, p, noID, ok := entryOf(obj)
	if !ok {
		return fmt.Errorf("node store: unexpected object %T", obj)
	}
	s.mu.Lock()
	changed := s.set(name, p, noID)
	s.mu.Unlock()
	s.enqueue(changed)
	return nil
}

// Add implements toolscache.ReflectorStore.
func (s *nodeStore) Add(obj any) error { return s.upsert(obj) }

// Update implements toolscache.ReflectorStore.
func (s *nodeStore) Update(obj any) error { return s.upsert(obj) }

// Delete implements toolscache.ReflectorStore.
func (s *nodeStore) Delete(obj any) error {
	name, _, _, ok := entryOf(obj)
	if !ok {
		return fmt.Errorf("node store: unexpected object %T", obj)
	}
	s.mu.Lock()
	old, had := s.nodes[name]
	if had {
		s.remove(name, old)
	}
	s.mu.Unlock()
	if had {
		s.enqueue([]string{old.platform})
	}
	return nil
}

// Replace implements toolscache.ReflectorStore: the store becomes list, and
// the platforms whose view changed are enqueued (all of them, the first
// time).
func (s *nodeStore) Replace(list []any, _ string) error {
	fresh := newNodeStoreFrom(nil)
	for _, obj := range list {
		name, p, noID, ok := entryOf(obj)
		if !ok {
			return fmt.Errorf("node store: unexpected object %T", obj)
		}
		fresh.set(name, p, noID)
	}
	s.mu.Lock()
	var changed []string
	for p, pn := range s.platforms {
		if !samePlatformNodes(pn, fresh.platforms[p]) {
			changed = append(changed, p)
		}
	}
	for p := range fresh.platforms {
		if _, ok := s.platforms[p]; !ok {
			changed = append(changed, p)
		}
	}
	s.nodes, s.platforms = fresh.nodes, fresh.platforms
	s.mu.Unlock()
	// Synced only once the list's platforms are in the queue: whoever
	// waited for the sync finds them there.
	s.enqueue(changed)
	s.syncOnce.Do(func() { close(s.synced) })
	return nil
}

func samePlatformNodes(a, b *platformNodes) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.count != b.count || len(a.withoutProviderID) != len(b.withoutProviderID) {
		return false
	}
	for n := range a.withoutProviderID {
		if _, ok := b.withoutProviderID[n]; !ok {
			return false
		}
	}
	return true
}

// Resync implements toolscache.ReflectorStore (nothing to do).
func (s *nodeStore) Resync() error { return nil }

// enqueue adds the NativeCCMs of the platforms to the controller's queue.
func (s *nodeStore) enqueue(platforms []string) {
	s.mu.RLock()
	q, ctx := s.queue, s.ctx
	s.mu.RUnlock()
	if q == nil || s.nativeCCMs == nil {
		return
	}
	for _, p := range platforms {
		if p == "" {
			continue
		}
		list, err := s.nativeCCMs(ctx, p)
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "list NativeCCMs for a change of nodes", "platform", p)
			continue
		}
		for _, n := range list {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: n}})
		}
	}
}

// nodeFacts is what a page of the node list is cut to (pagedNodes): a
// Node's name, its platform label and whether it has a providerID.
type nodeFacts struct {
	Name          string
	Platform      string
	HasProviderID bool
}

func (*nodeFacts) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (n *nodeFacts) DeepCopyObject() runtime.Object { c := *n; return &c }

// nodeFactsList is a page of the node list, cut (pagedNodes).
type nodeFactsList struct {
	metav1.ListMeta
	Items []nodeFacts
}

func (*nodeFactsList) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (l *nodeFactsList) DeepCopyObject() runtime.Object {
	c := &nodeFactsList{Items: slices.Clone(l.Items)}
	l.ListMeta.DeepCopyInto(&c.ListMeta)
	return c
}

// factsOf cuts a page of Nodes to nodeFacts, keeping only the Nodes with a
// platform label (the store keeps no other).
func factsOf(l *corev1.NodeList) *nodeFactsList {
	out := &nodeFactsList{ListMeta: l.ListMeta}
	for i := range l.Items {
		n := &l.Items[i]
		p := n.Labels[names.PlatformLabel]
		if p == "" {
			continue
		}
		out.Items = append(out.Items, nodeFacts{Name: n.Name, Platform: p, HasProviderID: n.Spec.ProviderID != ""})
	}
	return out
}

// nodePageSize bounds how many whole Nodes the node store decodes at once.
const nodePageSize = 250

// pagedNodes lists Nodes as a consistent read in pages of nodePageSize,
// each page cut down to nodeFacts before the next is read. A list at
// resourceVersion 0 (a reflector's first) would come from the API server's
// watch cache in one piece: every node whole, at once. Watch events come one
// node at a time and the nodeStore keeps only their facts.
type pagedNodes struct {
	lw toolscache.ListerWatcherWithContext
}

var (
	_ toolscache.ListerWatcher            = pagedNodes{}
	_ toolscache.ListerWatcherWithContext = pagedNodes{}
)

func (p pagedNodes) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	o.ResourceVersion, o.ResourceVersionMatch = "", ""
	if o.Limit == 0 || o.Limit > nodePageSize {
		o.Limit = nodePageSize
	}
	out, err := p.lw.ListWithContext(ctx, o)
	if l, ok := out.(*corev1.NodeList); ok && err == nil {
		return factsOf(l), nil
	}
	return out, err
}

func (p pagedNodes) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return p.lw.WatchWithContext(ctx, o)
}

func (p pagedNodes) List(o metav1.ListOptions) (runtime.Object, error) {
	return p.ListWithContext(context.Background(), o)
}

func (p pagedNodes) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return p.WatchWithContext(context.Background(), o)
}
