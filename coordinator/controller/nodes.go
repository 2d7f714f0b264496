package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// nodeStore is the coordinator's view of the cluster's Nodes. Of a Node it
// keeps only what the NativeCCM controller reads: the name, the platform
// label, the values of the domain labels (keys) and whether spec.providerID
// is set, and only of Nodes that have a
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
	// keys are the domain label keys whose values are kept, sorted.
	keys []string
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
	// group is the node's domain label values (platformNodes.groups).
	group *nodeGroup
}

// platformNodes is one platform's nodes.
type platformNodes struct {
	// name is the platform; every nodeEntry of the platform shares it.
	name  string
	count int
	// withoutProviderID names the platform's nodes with no providerID.
	withoutProviderID map[string]struct{}
	// groups count the nodes by their values of the domain labels (a few
	// per platform: its regions, projects), keyed by groupKey.
	groups map[string]*nodeGroup
}

// nodeGroup is the nodes of a platform with the same domain label values.
type nodeGroup struct {
	key string
	// values are aligned with nodeStore.keys; "" is an absent label.
	values []string
	count  int
}

// groupKey joins label values (which never contain NUL).
func groupKey(values []string) string { return strings.Join(values, "\x00") }

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
func newNodeStore(cfg *rest.Config, c client.Reader, keys []string) (*nodeStore, error) {
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
	s := newNodeStoreFrom(pagedNodes{lw: lw, keys: sortedKeys(keys)}, keys)
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

func newNodeStoreFrom(lw toolscache.ListerWatcher, keys []string) *nodeStore {
	return &nodeStore{
		lw:        lw,
		keys:      sortedKeys(keys),
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
func (s *nodeStore) entryOf(obj any) (f nodeFacts, ok bool) {
	switch n := obj.(type) {
	case *corev1.Node:
		return factOf(n, s.keys), true
	case *nodeFacts:
		return *n, true
	case toolscache.DeletedFinalStateUnknown:
		return s.entryOf(n.Obj)
	}
	return nodeFacts{}, false
}

// factOf cuts a Node to what the store keeps.
func factOf(n *corev1.Node, keys []string) nodeFacts {
	f := nodeFacts{Name: n.Name, Platform: n.Labels[names.PlatformLabel], HasProviderID: n.Spec.ProviderID != ""}
	if f.Platform != "" && len(keys) > 0 {
		f.Values = make([]string, len(keys))
		for i, k := range keys {
			f.Values[i] = n.Labels[k]
		}
	}
	return f
}

// set records what is kept of one node under s.mu and returns the platforms
// whose view changed.
func (s *nodeStore) set(f nodeFacts) []string {
	name, platform, noProviderID := f.Name, f.Platform, !f.HasProviderID
	old, had := s.nodes[name]
	if had && old.platform == platform && old.noProviderID == noProviderID && slices.Equal(old.group.values, f.Values) {
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
	if pn.groups == nil {
		pn.groups = map[string]*nodeGroup{}
	}
	key := groupKey(f.Values)
	g := pn.groups[key]
	if g == nil {
		g = &nodeGroup{key: key, values: f.Values}
		pn.groups[key] = g
	}
	g.count++
	s.nodes[name] = nodeEntry{platform: pn.name, noProviderID: noProviderID, group: g}
	if !had || old.platform != platform || old.group.key != g.key {
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
	if g := e.group; g != nil {
		if g.count--; g.count <= 0 {
			delete(pn.groups, g.key)
		}
	}
	if pn.count <= 0 {
		delete(s.platforms, e.platform)
	}
}

func (s *nodeStore) upsert(obj any) error {
	f, ok := s.entryOf(obj)
	if !ok {
		return fmt.Errorf("node store: unexpected object %T", obj)
	}
	s.mu.Lock()
	changed := s.set(f)
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
	f, ok := s.entryOf(obj)
	name := f.Name
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
	fresh := newNodeStoreFrom(nil, s.keys)
	for _, obj := range list {
		f, ok := s.entryOf(obj)
		if !ok {
			return fmt.Errorf("node store: unexpected object %T", obj)
		}
		fresh.set(f)
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
	if a.count != b.count || len(a.withoutProviderID) != len(b.withoutProviderID) || len(a.groups) != len(b.groups) {
		return false
	}
	for k, g := range a.groups {
		if h, ok := b.groups[k]; !ok || h.count != g.count {
			return false
		}
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
	// Values of the store's domain label keys ("" absent).
	Values []string
}

func (*nodeFacts) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (n *nodeFacts) DeepCopyObject() runtime.Object {
	c := *n
	c.Values = slices.Clone(n.Values)
	return &c
}

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
func factsOf(l *corev1.NodeList, keys []string) *nodeFactsList {
	out := &nodeFactsList{ListMeta: l.ListMeta}
	for i := range l.Items {
		n := &l.Items[i]
		if n.Labels[names.PlatformLabel] == "" {
			continue
		}
		out.Items = append(out.Items, factOf(n, keys))
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
	lw   toolscache.ListerWatcherWithContext
	keys []string
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
		return factsOf(l, p.keys), nil
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

func sortedKeys(keys []string) []string {
	out := slices.Clone(keys)
	slices.Sort(out)
	return slices.Compact(out)
}

// domainView is what the controller reads of the nodes of one domain.
type domainView struct {
	platformView
	// Values counts the domain's nodes by their value of the key asked for
	// (the profile's boundary label); "" counts those without it.
	Values map[string]int
}

// labelsOf are the labels a group's nodes carry (of the store's keys) and
// the platform label.
func (s *nodeStore) labelsOf(platform string, g *nodeGroup) map[string]string {
	l := make(map[string]string, len(s.keys)+1)
	for i, k := range s.keys {
		if i < len(g.values) && g.values[i] != "" {
			l[k] = g.values[i]
		}
	}
	l[names.PlatformLabel] = platform
	return l
}

// keeps reports the domain keys the store does not keep values of.
func (s *nodeStore) missingKeys(keys []string) []string {
	return slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return slices.Contains(s.keys, k) })
}

// domain returns the nodes of d, with their values of key by ("": none).
func (s *nodeStore) domain(d domain.Domain, by string) domainView {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v := domainView{}
	pn := s.platforms[d.Platform]
	if pn == nil {
		return v
	}
	in := map[*nodeGroup]bool{}
	for _, g := range pn.groups {
		l := s.labelsOf(d.Platform, g)
		if !d.Contains(names.PlatformLabel, l) {
			continue
		}
		in[g] = true
		v.Nodes += g.count
		if by != "" {
			if v.Values == nil {
				v.Values = map[string]int{}
			}
			v.Values[l[by]] += g.count
		}
	}
	for n := range pn.withoutProviderID {
		if !in[s.nodes[n].group] {
			continue
		}
		v.WithoutProviderID++
		v.FirstWithoutProviderID = insertFirst(v.FirstWithoutProviderID, n, shownWithoutProviderID)
	}
	return v
}

// nodesWhere names up to max nodes of platform, in name order, whose labels
// (of the store's keys) match, and counts them all.
func (s *nodeStore) nodesWhere(platform string, match func(labels map[string]string) bool, max int) (int, []string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pn := s.platforms[platform]
	if pn == nil {
		return 0, nil
	}
	matching := map[*nodeGroup]bool{}
	count := 0
	for _, g := range pn.groups {
		if match(s.labelsOf(platform, g)) {
			matching[g] = true
			count += g.count
		}
	}
	if count == 0 {
		return 0, nil
	}
	var first []string
	for n, e := range s.nodes {
		if e.platform == platform && matching[e.group] {
			first = insertFirst(first, n, max)
		}
	}
	return count, first
}

// insertFirst keeps the first max names in order.
func insertFirst(first []string, n string, max int) []string {
	if len(first) == max && n >= first[len(first)-1] {
		return first
	}
	i, _ := slices.BinarySearch(first, n)
	first = slices.Insert(first, i, n)
	if len(first) > max {
		first = first[:max]
	}
	return first
}
