package controller

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

func testNode(name, platform, providerID string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if platform != "" {
		n.Labels[names.PlatformLabel] = platform
	}
	n.Spec.ProviderID = providerID
	return n
}

// drain returns the names the queue holds, sorted, and empties it.
func drain(q queue) []string {
	var out []string
	for q.Len() > 0 {
		r, _ := q.Get()
		out = append(out, r.Name)
		q.Done(r)
		q.Forget(r)
	}
	slices.Sort(out)
	return out
}

func newTestQueue() queue {
	return workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
}

// A platform's view counts all its nodes without providerID and names the
// first few in name order, whatever order the store holds them in.
func TestPlatformViewNamesTheFirstFew(t *testing.T) {
	s := newNodeStoreFrom(nil, nil)
	names := []string{"n-07", "n-03", "n-11", "n-01", "n-09", "n-05", "n-02", "n-10", "n-04", "n-08", "n-06", "n-00"}
	for _, n := range names {
		s.set(nodeFacts{Name: n, Platform: "p", HasProviderID: false})
	}
	s.set(nodeFacts{Name: "n-with-id", Platform: "p", HasProviderID: true})
	got := s.platform("p")
	want := platformView{Nodes: len(names) + 1, WithoutProviderID: len(names), FirstWithoutProviderID: []string{"n-00", "n-01", "n-02", "n-03", "n-04"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("view %+v, want %+v", got, want)
	}
	s.set(nodeFacts{Name: "n-00", Platform: "p", HasProviderID: true})
	if got := s.platform("p"); got.WithoutProviderID != len(names)-1 || !slices.Equal(got.FirstWithoutProviderID, []string{"n-01", "n-02", "n-03", "n-04", "n-05"}) {
		t.Errorf("after n-00 got a providerID: %+v", got)
	}
}

// TestNodeStoreEvents: what the store keeps of each Node event, and which
// platforms' NativeCCMs it enqueues: only those whose count or nodes without
// providerID changed.
func TestNodeStoreEvents(t *testing.T) {
	s := newNodeStoreFrom(nil, nil)
	q := newTestQueue()
	defer q.ShutDown()
	s.queue, s.ctx = q, context.Background()
	// each platform has one NativeCCM named after it, "b" has two. The
	// first list's platforms are enqueued before the store reports synced:
	// whoever waited for the sync finds them in the queue.
	var syncedBeforeEnqueue []string
	s.nativeCCMs = func(_ context.Context, p string) ([]string, error) {
		select {
		case <-s.synced:
		default:
			syncedBeforeEnqueue = append(syncedBeforeEnqueue, p)
		}
		if p == "b" {
			return []string{"b", "b-2"}, nil
		}
		return []string{p}, nil
	}
	view := func(p string, nodes int, without ...string) {
		t.Helper()
		want := platformView{Nodes: nodes, WithoutProviderID: len(without)}
		if len(without) > 0 {
			want.FirstWithoutProviderID = without
		}
		if got := s.platform(p); !reflect.DeepEqual(got, want) {
			t.Errorf("platform %s: %+v, want %+v", p, got, want)
		}
	}
	enqueued := func(step string, want ...string) {
		t.Helper()
		if got := drain(q); !slices.Equal(got, want) {
			t.Errorf("%s: enqueued %v, want %v", step, got, want)
		}
	}

	for _, step := range []struct {
		name string
		do   func() error
		want []string
	}{
		{"first list", func() error {
			return s.Replace([]any{
				&nodeFacts{Name: "a1", Platform: "a", HasProviderID: true},
				&nodeFacts{Name: "a2", Platform: "a"},
				&nodeFacts{Name: "b1", Platform: "b", HasProviderID: true},
			}, "1")
		}, []string{"a", "b", "b-2"}},
		{"a node without platform", func() error { return s.Add(testNode("x1", "", "")) }, nil},
		{"a node joins a", func() error { return s.Add(testNode("a3", "a", "aws://1")) }, []string{"a"}},
		{"a node of a changes nothing read", func() error { return s.Update(testNode("a3", "a", "aws://1")) }, nil},
		{"a node gets its providerID", func() error { return s.Update(testNode("a2", "a", "aws://2")) }, []string{"a"}},
		{"a node's providerID changes", func() error { return s.Update(testNode("a2", "a", "aws://3")) }, nil},
		{"a node moves from a to b", func() error { return s.Update(testNode("a3", "b", "")) }, []string{"a", "b", "b-2"}},
		{"a node loses its platform", func() error { return s.Update(testNode("a1", "", "aws://1")) }, []string{"a"}},
		{"a node goes", func() error { return s.Delete(testNode("b1", "b", "hc://1")) }, []string{"b", "b-2"}},
		{"an unknown node goes", func() error { return s.Delete(testNode("x2", "c", "")) }, nil},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		enqueued(step.name, step.want...)
		if step.name == "first list" {
			slices.Sort(syncedBeforeEnqueue)
			if !slices.Equal(syncedBeforeEnqueue, []string{"a", "b"}) {
				t.Errorf("platforms enqueued before the store reported synced: %v, want [a b]", syncedBeforeEnqueue)
			}
		}
	}
	view("a", 1)
	view("b", 1, "a3")
	view("c", 0)
	if len(s.nodes) != 2 {
		t.Errorf("kept %d nodes, want 2 (a2, a3): %v", len(s.nodes), s.nodes)
	}

	// A relist that changes only platform c's nodes enqueues only c.
	if err := s.Replace([]any{
		&nodeFacts{Name: "a2", Platform: "a", HasProviderID: true},
		&nodeFacts{Name: "a3", Platform: "b"},
		&nodeFacts{Name: "c1", Platform: "c"},
	}, "2"); err != nil {
		t.Fatal(err)
	}
	enqueued("relist", "c")
	view("c", 1, "c1")
	// A relist without platform b's nodes enqueues b.
	if err := s.Replace([]any{testNode("a2", "a", "aws://2"), testNode("c1", "c", "")}, "3"); err != nil {
		t.Fatal(err)
	}
	enqueued("relist without b", "b", "b-2")
	view("b", 0)

	if err := s.Add("not a node"); err == nil {
		t.Error("Add of a string: no error")
	}
	select {
	case <-s.synced:
	default:
		t.Error("not synced after a complete list")
	}
}

// TestNodeStoreSyncsFromAPIServer: against the API server, the store lists
// Nodes in pages (more than one here), is synced only then, and follows
// the watch. The platforms are the test's own; no NativeCCM has them.
func TestNodeStoreSyncsFromAPIServer(t *testing.T) {
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	const perPlatform = nodePageSize + 30 // 840 nodes in all: four pages
	var created []string
	t.Cleanup(func() {
		for _, n := range created {
			_ = k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	})
	for i := range perPlatform {
		for _, p := range []string{"store-a", "store-b", ""} {
			name := fmt.Sprintf("%s-%03d", p, i)
			if p == "" {
				name = fmt.Sprintf("store-none-%03d", i)
			}
			id := ""
			if i%100 != 0 {
				id = "test://" + name
			}
			if err := k8s.Create(ctx, testNode(name, p, id)); err != nil {
				t.Fatal(err)
			}
			created = append(created, name)
		}
	}

	s, err := newNodeStore(env.Config, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	enqueued := sets.New[string]()
	s.nativeCCMs = func(_ context.Context, p string) ([]string, error) { return []string{p}, nil }
	q := newTestQueue()
	defer q.ShutDown()
	if err := s.Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	withoutID := []string{"store-a-000", "store-a-100", "store-a-200"}
	if got := s.platform("store-a"); got.Nodes != perPlatform || got.WithoutProviderID != len(withoutID) || !slices.Equal(got.FirstWithoutProviderID, withoutID) {
		t.Errorf("store-a after the list: %d nodes, %d without providerID %v; want %d and %v", got.Nodes, got.WithoutProviderID, got.FirstWithoutProviderID, perPlatform, withoutID)
	}
	if got := s.platform("store-b"); got.Nodes != perPlatform {
		t.Errorf("store-b after the list: %d nodes, want %d", got.Nodes, perPlatform)
	}
	for _, n := range drain(q) {
		enqueued.Insert(n)
	}
	if !enqueued.HasAll("store-a", "store-b") {
		t.Errorf("after the list, enqueued %v; want store-a and store-b", sets.List(enqueued))
	}

	// The watch: a node moves from store-a to store-b, one gets its providerID,
	// an unlabelled one joins store-a, and one of store-b goes.
	update := func(name string, change func(*corev1.Node)) {
		t.Helper()
		n := testNode(name, "", "")
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
			t.Fatal(err)
		}
		change(n)
		if err := k8s.Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	update("store-a-001", func(n *corev1.Node) { n.Labels[names.PlatformLabel] = "store-b" })
	update("store-a-100", func(n *corev1.Node) { n.Spec.ProviderID = "test://fixed" })
	update("store-none-005", func(n *corev1.Node) { n.Labels[names.PlatformLabel] = "store-a" })
	if err := k8s.Delete(ctx, testNode("store-b-007", "", "")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the store follows the watch", func() (bool, string) {
		a, b := s.platform("store-a"), s.platform("store-b")
		return a.Nodes == perPlatform && b.Nodes == perPlatform &&
				slices.Equal(a.FirstWithoutProviderID, []string{"store-a-000", "store-a-200"}) && a.WithoutProviderID == 2 &&
				slices.Equal(b.FirstWithoutProviderID, []string{"store-b-000", "store-b-100", "store-b-200"}) && b.WithoutProviderID == 3,
			fmt.Sprintf("store-a %d %d %v, store-b %d %d %v", a.Nodes, a.WithoutProviderID, a.FirstWithoutProviderID, b.Nodes, b.WithoutProviderID, b.FirstWithoutProviderID)
	})
	enqueued = sets.New[string]()
	eventually(t, "the watch events enqueue store-a and store-b", func() (bool, string) {
		enqueued.Insert(drain(q)...)
		return enqueued.Equal(sets.New("store-a", "store-b")), fmt.Sprint(sets.List(enqueued))
	})
}

// TestNodeStoreDomains: the store keeps the domain labels' values, a node
// moving between domains of one platform enqueues the platform, and the
// domain views count and name the nodes of a domain.
func TestNodeStoreDomains(t *testing.T) {
	const region = "topology.kubernetes.io/region"
	s := newNodeStoreFrom(nil, []string{region, v1.DomainLabel})
	q := newTestQueue()
	defer q.ShutDown()
	s.queue, s.ctx = q, context.Background()
	s.nativeCCMs = func(_ context.Context, p string) ([]string, error) { return []string{p}, nil }
	node := func(name, platform, r, providerID string) *corev1.Node {
		n := testNode(name, platform, providerID)
		if r != "" {
			n.Labels[region] = r
		}
		return n
	}
	for _, n := range []*corev1.Node{
		node("eu-1", "aws", "eu-west-1", "aws:///a/i-1"),
		node("eu-2", "aws", "eu-west-1", ""),
		node("us-1", "aws", "us-east-1", "aws:///b/i-3"),
		node("none", "aws", "", "aws:///c/i-4"),
		node("hc-1", "hcloud", "eu-west-1", "hcloud://1"),
	} {
		if err := s.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	drain(q)
	eu := domain.Domain{Platform: "aws", Require: map[string][]string{region: {"eu-west-1"}}}
	got := s.domain(eu, region)
	want := domainView{platformView: platformView{Nodes: 2, WithoutProviderID: 1, FirstWithoutProviderID: []string{"eu-2"}}, Values: map[string]int{"eu-west-1": 2}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("eu domain: %+v, want %+v", got, want)
	}
	whole := s.domain(domain.Domain{Platform: "aws"}, region)
	if whole.Nodes != 4 || !reflect.DeepEqual(whole.Values, map[string]int{"eu-west-1": 2, "us-east-1": 1, "": 1}) {
		t.Errorf("the whole platform: %+v", whole)
	}
	count, first := s.nodesWhere("aws", func(l map[string]string) bool { return l[region] != "eu-west-1" }, 1)
	if count != 2 || !slices.Equal(first, []string{"none"}) {
		t.Errorf("nodes outside eu-west-1: %d %v", count, first)
	}
	// a node relabelled into another region moves, and its platform is enqueued
	if err := s.Update(node("eu-1", "aws", "us-east-1", "aws:///a/i-1")); err != nil {
		t.Fatal(err)
	}
	if got := drain(q); !slices.Equal(got, []string{"aws"}) {
		t.Errorf("after a relabel: enqueued %v, want [aws]", got)
	}
	if got := s.domain(eu, region); got.Nodes != 1 {
		t.Errorf("eu after the relabel: %+v", got)
	}
	// the same labels again change nothing
	if err := s.Update(node("eu-1", "aws", "us-east-1", "aws:///a/i-1")); err != nil {
		t.Fatal(err)
	}
	if got := drain(q); len(got) != 0 {
		t.Errorf("no change enqueued %v", got)
	}
	if got := s.missingKeys([]string{region, "x.io/y"}); !slices.Equal(got, []string{"x.io/y"}) {
		t.Errorf("missing keys %v", got)
	}
	// a list with the same nodes but other groups is a change
	if err := s.Replace([]any{&nodeFacts{Name: "eu-2", Platform: "aws", Values: []string{"", "eu-west-1"}}}, "2"); err != nil {
		t.Fatal(err)
	}
	if got := s.domain(eu, ""); got.Nodes != 1 {
		t.Errorf("after the list: %+v", got)
	}
}
