package serviceview

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/url"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/internal/servicetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// The tests of the decision layer and the emission use the fixture of every
// Service test.
var (
	codecs      = servicetest.Codecs
	svc         = servicetest.Svc
	factsOf     = servicetest.FactsOf
	scanService = servicetest.ScanService
)

type codec = servicetest.Codec

func TestServiceView(t *testing.T) {
	const own, other = "hybridccm.io/hcloud", "hybridccm.io/aws"
	lb, cip := "LoadBalancer", "ClusterIP"
	tests := []struct {
		name string
		// svc is the Service; class and isDefault configure the view.
		svc       *corev1.Service
		class     string
		isDefault bool
		// want: in the view.
		want bool
	}{
		{name: "own class", svc: svc("a", lb, ptr.To(own)), class: own, want: true},
		{name: "other class", svc: svc("a", lb, ptr.To(other)), class: own},
		{name: "classless, not the default", svc: svc("a", lb, nil), class: own},
		{name: "classless, the default", svc: svc("a", lb, nil), class: own, isDefault: true, want: true},
		{name: "other class, the default", svc: svc("a", lb, ptr.To(other)), class: own, isDefault: true},
		{name: "ClusterIP", svc: svc("a", cip, nil), class: own, isDefault: true},
		{name: "ClusterIP still with the cleanup finalizer", svc: svc("a", cip, nil, service.LoadBalancerCleanupFinalizer), class: own, want: true},
		{name: "ClusterIP with another finalizer", svc: svc("a", cip, nil, "x.io/y"), class: own},
		{name: "no class configured: nothing", svc: svc("a", lb, nil), class: ""},
		{name: "no class configured: no cleanup either", svc: svc("a", cip, nil, service.LoadBalancerCleanupFinalizer), class: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewView(tc.class, tc.isDefault)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range codecs(t) {
				f := c.Scan(t, c.Encode(t, tc.svc)).Facts
				if f != factsOf(tc.svc) {
					t.Fatalf("%s: facts %+v, want %+v", c.Name, f, factsOf(tc.svc))
				}
				if got := v.Shows(f); got != tc.want {
					t.Fatalf("%s: shows = %v, want %v", c.Name, got, tc.want)
				}
			}
		})
	}
	for _, bad := range []struct{ class string }{{"not a class!"}, {"/x"}} {
		if _, err := NewView(bad.class, false); err == nil {
			t.Errorf("class %q accepted", bad.class)
		}
	}
	if _, err := NewView("", true); err == nil {
		t.Error("default without a class accepted")
	}
}

// testGate is the Service view of a gate, with no history unless a test
// gives it one.
type testGate struct {
	view    View
	history *History
}

func testProxy(t testing.TB, class string, isDefault bool) *testGate {
	t.Helper()
	v, err := NewView(class, isDefault)
	if err != nil {
		t.Fatal(err)
	}
	return &testGate{view: v}
}

// watchState starts the state of a watch of p's view with the query q.
func (p *testGate) watchState(q url.Values) *WatchState {
	return NewWatchState(p.view, p.history, q)
}

// filterList is the view's filter of a list, with p's view.
func (p *testGate) filterList(media wire.Media, in io.Reader, out *bufio.Writer) error {
	return FilterList(media, p.view, in, out)
}

// listFilter is the view's filter of a list in c's encoding.
func listFilter(c codec, p *testGate) func(io.Reader, *bufio.Writer) error {
	return func(in io.Reader, out *bufio.Writer) error { return p.filterList(c.Media, in, out) }
}

// watchFilter is the view's filter of a watch in c's encoding.
func watchFilter(c codec, s *WatchState) func(io.Reader, *bufio.Writer) error {
	return func(in io.Reader, out *bufio.Writer) error { return FilterWatch(c.Media, s, in, out) }
}

func TestFilterList(t *testing.T) {
	const own = "hybridccm.io/hcloud"
	list := &corev1.ServiceList{
		TypeMeta: metav1.TypeMeta{Kind: "ServiceList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: "99", Continue: "token", RemainingItemCount: ptr.To[int64](12)},
		Items: []corev1.Service{
			*svc("own", "LoadBalancer", ptr.To(own)),
			*svc("aws", "LoadBalancer", ptr.To("hybridccm.io/aws")),
			*svc("classless", "LoadBalancer", nil),
			*svc("cluster-ip", "ClusterIP", nil),
			*svc("own-2", "LoadBalancer", ptr.To(own)),
		},
	}
	defer func(b int) { protoListBuffer = b }(protoListBuffer)
	for _, c := range codecs(t) {
		t.Run(c.Name, func(t *testing.T) {
			for _, tc := range []struct {
				isDefault bool
				// buffer is protoListBuffer: small ones make the gate stream
				// the protobuf list and pad it.
				buffer int
				want   []string
			}{
				{want: []string{"own", "own-2"}, buffer: 1 << 20},
				{isDefault: true, want: []string{"own", "classless", "own-2"}, buffer: 1 << 20},
				{want: []string{"own", "own-2"}, buffer: 1},
				{isDefault: true, want: []string{"own", "classless", "own-2"}, buffer: 700},
			} {
				protoListBuffer = tc.buffer
				p := testProxy(t, own, tc.isDefault)
				var out bytes.Buffer
				w := bufio.NewWriter(&out)
				filter := listFilter(c, p)
				// One byte at a time: every boundary falls inside a read.
				if err := filter(&oneByteReader{r: bytes.NewReader(c.Encode(t, list))}, w); err != nil {
					t.Fatal(err)
				}
				_ = w.Flush()
				var got corev1.ServiceList
				c.Decode(t, out.Bytes(), &got)
				var names []string
				for _, s := range got.Items {
					names = append(names, s.Name)
					if s.Spec.LoadBalancerClass != nil || len(s.Status.LoadBalancer.Ingress) != 1 || s.Labels["app"] != s.Name {
						t.Fatalf("item %+v", s)
					}
				}
				// Of the list's metadata only the resourceVersion passes.
				if !slices.Equal(names, tc.want) || !apiequality.Semantic.DeepEqual(got.ListMeta, metav1.ListMeta{ResourceVersion: "99"}) {
					t.Fatalf("got %v %+v", names, got.ListMeta)
				}
			}
			// The view without a class: an empty list, same resourceVersion.
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
			filter := listFilter(c, testProxy(t, "", false))
			if err := filter(bytes.NewReader(c.Encode(t, list)), w); err != nil {
				t.Fatal(err)
			}
			_ = w.Flush()
			var got corev1.ServiceList
			c.Decode(t, out.Bytes(), &got)
			if len(got.Items) != 0 || got.ResourceVersion != "99" {
				t.Fatalf("hidden view: %+v", got)
			}
		})
	}
	// Truncated and malformed lists are errors, never a partial answer.
	for _, c := range codecs(t) {
		b := bytes.TrimSpace(c.Encode(t, list))
		for _, cut := range []int{1, 10, len(b) / 2, len(b) - 1} {
			filter := listFilter(c, testProxy(t, own, false))
			if err := filter(bytes.NewReader(b[:cut]), bufio.NewWriter(io.Discard)); err == nil {
				t.Errorf("%s cut at %d: no error", c.Name, cut)
			}
		}
	}
}

type oneByteReader struct{ r io.Reader }

func (o *oneByteReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

func TestFilterWatch(t *testing.T) {
	const own = "hybridccm.io/hcloud"
	lb := func(name string, class *string, rv string, finalizers ...string) *corev1.Service {
		s := svc(name, "LoadBalancer", class, finalizers...)
		s.ResourceVersion = rv
		return s
	}
	cip := func(name, rv string, finalizers ...string) *corev1.Service {
		s := svc(name, "ClusterIP", nil, finalizers...)
		s.ResourceVersion = rv
		return s
	}
	bookmark := &corev1.Service{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "50", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	status := &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old"}
	in := []watch.Event{
		{Type: watch.Added, Object: lb("own", ptr.To(own), "10")},
		{Type: watch.Added, Object: lb("aws", ptr.To("hybridccm.io/aws"), "11")},
		{Type: watch.Bookmark, Object: bookmark},
		{Type: watch.Modified, Object: lb("own", ptr.To(own), "12", service.LoadBalancerCleanupFinalizer)},
		{Type: watch.Modified, Object: lb("aws", ptr.To("hybridccm.io/aws"), "13")},
		// Type changed: the class is gone, the finalizer holds it in the view
		// until its owner has deleted the load balancer.
		{Type: watch.Modified, Object: cip("own", "14", service.LoadBalancerCleanupFinalizer)},
		{Type: watch.Modified, Object: cip("own", "15")},
		// A ClusterIP turned into a LoadBalancer of this class appears.
		{Type: watch.Modified, Object: lb("aws", ptr.To(own), "16")},
		{Type: watch.Deleted, Object: lb("aws", ptr.To(own), "17")},
		{Type: watch.Deleted, Object: cip("own", "18")},
		{Type: watch.Error, Object: status},
	}
	want := []string{
		"ADDED own 10", "BOOKMARK 50", "MODIFIED own 12", "MODIFIED own 14", "DELETED own 15",
		"ADDED aws 16", "DELETED aws 17", "ERROR",
	}
	for _, c := range codecs(t) {
		t.Run(c.Name, func(t *testing.T) {
			p := testProxy(t, own, false)
			filter := watchFilter(c, p.watchState(map[string][]string{"sendInitialEvents": {"true"}}))
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
			if err := filter(&oneByteReader{r: bytes.NewReader(c.WatchStream(t, in...))}, w); err != nil {
				t.Fatal(err)
			}
			_ = w.Flush()
			var got []string
			for _, ev := range c.ReadWatch(t, out.Bytes()) {
				switch o := ev.Object.(type) {
				case *corev1.Service:
					if o.Spec.LoadBalancerClass != nil {
						t.Fatalf("class shown: %+v", o)
					}
					if o.Name == "own" && o.ResourceVersion == "15" && (o.Spec.Type != "" || len(o.Labels) > 0 || o.UID != "uid-x") {
						t.Fatalf("own left the view: want its tombstone, got %+v", o)
					}
					got = append(got, strings.Join(strings.Fields(string(ev.Type)+" "+o.Name+" "+o.ResourceVersion), " "))
				default:
					got = append(got, string(ev.Type))
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("got  %v\nwant %v", got, want)
			}
		})
	}
}

func TestWatchDecide(t *testing.T) {
	const own = "hybridccm.io/hcloud"
	svcAt := func(name, typ, class, rv string) *service.Service {
		f := service.Facts{Namespace: "ns", Name: name, UID: "uid-" + name, Type: typ, ResourceVersion: rv}
		if class != "" {
			f.Class, f.HasClass = class, true
		}
		return &service.Service{Facts: f}
	}
	in := svcAt("a", "LoadBalancer", own, "50")
	out := svcAt("a", "LoadBalancer", "x.io/y", "50")
	// The history: shown was in the view from 7 on, later from 60 on, gone
	// from 7 to 20, left from 8 to 30.
	history := &History{isSynced: true, floor: 5, horizon: 100, advanced: make(chan struct{}), passages: map[string][]passage{
		"ns/shown": {{from: 7, uid: "uid-old"}},
		"ns/later": {{from: 60, uid: "uid-later"}},
		"ns/gone":  {{from: 7, to: 20, uid: "uid-gone"}},
		"ns/left":  {{from: 8, to: 30, uid: "uid-left"}},
	}}
	tests := []struct {
		name string
		// query starts the watch.
		query map[string][]string
		// event and svc are the API server's first event about a Service.
		event string
		svc   *service.Service
		// want is the event the client gets ("" none), tombstone whether it
		// carries a tombstone (else the Service).
		want      string
		tombstone bool
		// uid is the tombstone's.
		uid string
	}{
		{name: "resumed: own Service modified", query: rv("10"), event: service.EventModified, svc: in, want: service.EventModified},
		{name: "resumed: own Service created", query: rv("10"), event: service.EventAdded, svc: in, want: service.EventAdded},
		{name: "resumed: own Service deleted", query: rv("10"), event: service.EventDeleted, svc: in, want: service.EventDeleted},
		{name: "resumed: foreign Service created", query: rv("10"), event: service.EventAdded, svc: out},
		{name: "resumed: foreign Service modified", query: rv("10"), event: service.EventModified, svc: out},
		{name: "resumed: foreign Service deleted", query: rv("10"), event: service.EventDeleted, svc: out},
		{name: "resumed: in the view before, left now", query: rv("10"), event: service.EventModified,
			svc: svcAt("shown", "ClusterIP", "", "50"), want: service.EventDeleted, tombstone: true, uid: "uid-old"},
		{name: "resumed: deleted now, after it left the view", query: rv("10"), event: service.EventDeleted,
			svc: svcAt("shown", "ClusterIP", "", "50"), want: service.EventDeleted, tombstone: true, uid: "uid-old"},
		{name: "resumed: in the view only from after the event", query: rv("10"), event: service.EventModified,
			svc: svcAt("later", "ClusterIP", "", "55")},
		{name: "resumed: in the view just before the event", query: rv("10"), event: service.EventModified,
			svc: svcAt("later", "ClusterIP", "", "70"), want: service.EventDeleted, tombstone: true, uid: "uid-later"},
		{name: "resumed: left the view before the event", query: rv("10"), event: service.EventModified,
			svc: svcAt("left", "ClusterIP", "", "40")},
		{name: "resumed: left the view with this event", query: rv("10"), event: service.EventModified,
			svc: svcAt("left", "ClusterIP", "", "30"), want: service.EventDeleted, tombstone: true, uid: "uid-left"},
		{name: "resumed: enters the view", query: rv("10"), event: service.EventModified,
			svc: svcAt("entering", "LoadBalancer", own, "50"), want: service.EventModified},
		{name: "event older than the history: the watch ends", query: rv("3"), event: service.EventModified,
			svc: svcAt("secret-name", "ClusterIP", "", "4"), want: service.EventError},
		{name: "event past the history's horizon (it never catches up): the watch ends", query: rv("10"), event: service.EventModified,
			svc: svcAt("secret-name", "ClusterIP", "", "150"), want: service.EventError},
		{name: "event without a resourceVersion: the watch ends", query: rv("10"), event: service.EventModified,
			svc: svcAt("secret-name", "ClusterIP", "", ""), want: service.EventError},
		{name: "legacy watch with initial state: foreign", query: rv("0"), event: service.EventModified, svc: svcAt("shown", "ClusterIP", "", "50")},
		{name: "legacy watch from now: foreign", query: map[string][]string{}, event: service.EventModified, svc: svcAt("shown", "ClusterIP", "", "50")},
		{name: "legacy watch: own Service enters", query: map[string][]string{}, event: service.EventModified, svc: in, want: service.EventAdded},
		{name: "sendInitialEvents=false from now: foreign", query: map[string][]string{"sendInitialEvents": {"false"}}, event: service.EventModified, svc: out},
		{name: "sendInitialEvents=false from now: left the view", query: map[string][]string{"sendInitialEvents": {"false"}}, event: service.EventModified,
			svc: svcAt("shown", "ClusterIP", "", "50"), want: service.EventDeleted, tombstone: true, uid: "uid-old"},
		{name: "WatchList: own Service enters the view", query: map[string][]string{"sendInitialEvents": {"true"}, "resourceVersion": {"10"}}, event: service.EventModified, svc: in, want: service.EventAdded},
		{name: "WatchList: foreign Service shown before", query: map[string][]string{"sendInitialEvents": {"true"}}, event: service.EventModified, svc: svcAt("shown", "ClusterIP", "", "50")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := testProxy(t, own, false)
			p.history = history
			s := p.watchState(tc.query)
			got, err := s.decide(service.WatchEvent{Type: tc.event, Service: tc.svc})
			if err != nil {
				t.Fatal(err)
			}
			if got.typ != tc.want || (got.kind == sendTombstone) != tc.tombstone || got.meta.UID != tc.uid {
				t.Fatalf("got %+v, want %q (tombstone %v, uid %q)", got, tc.want, tc.tombstone, tc.uid)
			}
			if got.kind == sendStatus && (!got.last || got.status.Code != 410 || strings.Contains(got.status.Message, tc.svc.Name)) {
				t.Fatalf("a watch the view cannot continue: %+v", got)
			}
			if got.kind == sendTombstone && (got.meta.Name != tc.svc.Name || got.meta.ResourceVersion != tc.svc.ResourceVersion || got.meta.Type != "") {
				t.Fatalf("tombstone %+v", got.meta)
			}
		})
	}
	// The view without a class never names a Service, and needs no history.
	s := testProxy(t, "", false).watchState(rv("10"))
	for _, ev := range []string{service.EventAdded, service.EventModified, service.EventDeleted} {
		if got, err := s.decide(service.WatchEvent{Type: ev, Service: in}); err != nil || got.kind != sendNothing {
			t.Fatalf("hidden view: %+v %v", got, err)
		}
	}
}

func rv(v string) map[string][]string { return map[string][]string{"resourceVersion": {v}} }

// TestFilterWatchJSONMemberOrder: an event whose object comes before its type
// (the API server writes the type first) is read all the same.
func TestFilterWatchJSONMemberOrder(t *testing.T) {
	const own = "hybridccm.io/hcloud"
	in := `{"object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","resourceVersion":"5"},"spec":{"type":"LoadBalancer","loadBalancerClass":"` + own + `","ports":[{"port":80}]}},"type":"ADDED"}` + "\n" +
		`{"type":"ADDED","object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"b","namespace":"ns","resourceVersion":"6"},"spec":{"loadBalancerClass":"x.io/other","type":"LoadBalancer"}}}`
	s := testProxy(t, own, false).watchState(map[string][]string{"resourceVersion": {"0"}})
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	if err := FilterWatch(wire.MediaJSON, s, strings.NewReader(in), w); err != nil {
		t.Fatal(err)
	}
	_ = w.Flush()
	want := `{"type":"ADDED","object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","resourceVersion":"5"},"spec":{"type":"LoadBalancer","ports":[{"port":80}]}}}` + "\n"
	if out.String() != want {
		t.Fatalf("got  %s\nwant %s", out.String(), want)
	}
}

// TestProtoPadding: every padding length but one is written exactly, as
// fields a decoder skips.
func TestProtoPadding(t *testing.T) {
	for _, n := range []uint64{0, 2, 3, 127, 128, 129, 130, 131, 132, 16385, 16386, 16387, 1 << 20} {
		var out bytes.Buffer
		w := bufio.NewWriter(&out)
		if err := writeProtoPadding(w, n); err != nil {
			t.Fatalf("%d: %v", n, err)
		}
		_ = w.Flush()
		if uint64(out.Len()) != n {
			t.Fatalf("padding of %d is %d bytes", n, out.Len())
		}
		if err := wire.ProtoFields(out.Bytes(), func(f wire.ProtoField) error {
			if f.Num != pbListPadding {
				return errors.New("not the padding field")
			}
			return nil
		}); err != nil {
			t.Fatalf("%d: %v", n, err)
		}
	}
	if err := writeProtoPadding(bufio.NewWriter(io.Discard), 1); err == nil {
		t.Fatal("a padding of one byte cannot be written")
	}
}

// filterList is the view's filter of a list, with p's view.
