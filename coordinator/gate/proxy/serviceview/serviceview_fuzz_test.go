package serviceview

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// The view, checked against a model: a script of changes to a few Services
// is played as the API server would answer a list or a watch with the
// request's parameters (watch, sendInitialEvents, resourceVersion "", 0,
// older than the gate or current, resourceVersionMatch,
// allowWatchBookmarks; JSON or protobuf), the gate's history having seen the
// changes since it started. Whatever the gate answers, decoded as client-go
// decodes it, must
//
//   - carry a Service only in a state that is in the view, exactly as the API
//     server sent it but for its class;
//   - delete a Service only the client holds, the tombstone carrying its
//     namespace, name, uid and resourceVersion and nothing else;
//   - carry bookmarks with their resourceVersion (and initial-events-end)
//     only;
//   - leave the client holding exactly the Services in the view at the end,
//     unless the gate ended the watch because it cannot tell what the client
//     holds, which it may only for a watch resumed from before the history.

const (
	fuzzOwnClass   = "x.io/own"
	fuzzOtherClass = "x.io/other"
	fuzzFirstRV    = 100
)

// fuzzRequest is a request's parameters, read from two bytes.
type fuzzRequest struct {
	media wire.Media
	// list: a list (at the state after floor+start events), not a watch.
	list      bool
	initial   string // sendInitialEvents: "", "true" or "false"
	rv        string // "", "0", "old" or "current"
	rvMatch   string // resourceVersionMatch: "", "NotOlderThan" or "Exact"
	bookmarks bool
	// defaultLBs configures the view; errorAtEnd ends the stream with the
	// API server's ERROR.
	defaultLBs, errorAtEnd bool
}

func readFuzzRequest(p uint16) fuzzRequest {
	pick := func(n int, vs ...string) string { return vs[n%len(vs)] }
	return fuzzRequest{
		media:      []wire.Media{wire.MediaJSON, wire.MediaProtobuf}[p&1],
		list:       p>>1&1 == 1,
		initial:    pick(int(p>>2&3), "", "true", "false", ""),
		rv:         pick(int(p>>4&3), "", "0", "old", "current"),
		rvMatch:    pick(int(p>>6&3), "", "NotOlderThan", "Exact", "NotOlderThan"),
		bookmarks:  p>>8&1 == 1,
		defaultLBs: p>>9&1 == 1,
		errorAtEnd: p>>10&1 == 1,
	}
}

func (r fuzzRequest) encode() uint16 {
	var p uint16
	if r.media == wire.MediaProtobuf {
		p |= 1
	}
	if r.list {
		p |= 2
	}
	p |= uint16(slices.Index([]string{"", "true", "false"}, r.initial)) << 2
	p |= uint16(slices.Index([]string{"", "0", "old", "current"}, r.rv)) << 4
	p |= uint16(slices.Index([]string{"", "NotOlderThan", "Exact"}, r.rvMatch)) << 6
	for bit, set := range map[int]bool{8: r.bookmarks, 9: r.defaultLBs, 10: r.errorAtEnd} {
		if set {
			p |= 1 << bit
		}
	}
	return p
}

// fuzzEvent is one change of the script, as the API server streams it.
type fuzzEvent struct {
	typ watch.EventType
	svc *corev1.Service
}

// playScript turns a script (two bytes a change) into the API server's
// events: Services ns/s0..s3 created, changed and deleted.
func playScript(script []byte) []fuzzEvent {
	state := map[string]*corev1.Service{}
	var out []fuzzEvent
	for i := 0; i+1 < len(script) && len(out) < 64; i += 2 {
		a, b := script[i], script[i+1]
		name := fmt.Sprintf("s%d", a&3)
		rv := strconv.Itoa(fuzzFirstRV + len(out) + 1)
		old := state[name]
		if a>>2&3 == 2 {
			if old == nil {
				continue
			}
			gone := old.DeepCopy()
			gone.ResourceVersion = rv
			delete(state, name)
			out = append(out, fuzzEvent{typ: watch.Deleted, svc: gone})
			continue
		}
		s := &corev1.Service{
			TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name + "-" + rv), ResourceVersion: rv,
				Labels: map[string]string{"app": name}, Annotations: map[string]string{"step": rv, "content": strconv.Itoa(int(b >> 5))}},
			Spec: corev1.ServiceSpec{Type: []corev1.ServiceType{"LoadBalancer", "LoadBalancer", "ClusterIP", "NodePort"}[b&3],
				Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}
		if old != nil {
			s.UID = old.UID
		}
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			// The API server keeps a LoadBalancer's class; other types have none.
			switch {
			case old != nil && old.Spec.Type == corev1.ServiceTypeLoadBalancer:
				s.Spec.LoadBalancerClass = old.Spec.LoadBalancerClass
			case b>>2&3 == 0 || b>>2&3 == 3:
				s.Spec.LoadBalancerClass = ptr.To(fuzzOwnClass)
			case b>>2&3 == 1:
				s.Spec.LoadBalancerClass = ptr.To(fuzzOtherClass)
			}
		}
		if b>>4&1 == 1 {
			s.Finalizers = []string{service.LoadBalancerCleanupFinalizer}
		}
		typ := watch.Modified
		if old == nil {
			typ = watch.Added
		}
		state[name] = s
		out = append(out, fuzzEvent{typ: typ, svc: s})
	}
	return out
}

// stateAfter is the Services after the first n events, by name.
func stateAfter(events []fuzzEvent, n int) map[string]*corev1.Service {
	state := map[string]*corev1.Service{}
	for _, ev := range events[:n] {
		if ev.typ == watch.Deleted {
			delete(state, ev.svc.Name)
		} else {
			state[ev.svc.Name] = ev.svc
		}
	}
	return state
}

func sortedServices(state map[string]*corev1.Service) []*corev1.Service {
	var out []*corev1.Service
	for _, s := range state {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *corev1.Service) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// FuzzServiceView plays a script of changes through the view with the
// parameters of a request, and checks what the client gets against the
// model (see above). floor and start place the gate's start and the
// request among the script's events; at is the version a resumed watch
// gives.
func FuzzServiceView(f *testing.F) {
	// Every combination of the parameters, with a script that creates a
	// Service in the view and one outside, takes one out (type changed,
	// finalizer gone), brings one in (a ClusterIP turned LoadBalancer of the
	// class), deletes one of each, and changes a foreign one in between.
	script := []byte{
		0x00, 0x00, // s0: LoadBalancer of the class
		0x01, 0x04, // s1: LoadBalancer of another class
		0x02, 0x02, // s2: ClusterIP
		0x03, 0x10, // s3: LoadBalancer of the class, with the finalizer
		0x01, 0x24, // s1 changes
		0x00, 0x02, // s0: ClusterIP, leaves the view
		0x03, 0x12, // s3: ClusterIP with the finalizer, stays
		0x03, 0x02, // s3: finalizer gone, leaves
		0x02, 0x00, // s2: LoadBalancer of the class, enters
		0x01, 0x44, // s1 changes
		0x09, 0x00, // s1 deleted
		0x0a, 0x00, // s2 deleted
		0x00, 0x08, // s0: LoadBalancer without a class (the default's)
		0x01, 0x00, // s1 created again in the view
	}
	// Every combination of the request's parameters once, the gate's start,
	// the request and the resumed version placed in turn before, among and
	// after the changes, the view with and without the default, and with
	// and without an ERROR at the end.
	places := [][3]uint8{{2, 4, 1}, {6, 3, 5}, {0, 0, 0}, {9, 2, 10}}
	n := 0
	for _, media := range []wire.Media{wire.MediaJSON, wire.MediaProtobuf} {
		for _, list := range []bool{false, true} {
			for _, initial := range []string{"", "true", "false"} {
				for _, rv := range []string{"", "0", "old", "current"} {
					for _, rvMatch := range []string{"", "NotOlderThan", "Exact"} {
						for _, bookmarks := range []bool{false, true} {
							r := fuzzRequest{media: media, list: list, initial: initial, rv: rv, rvMatch: rvMatch, bookmarks: bookmarks,
								defaultLBs: n%2 == 1, errorAtEnd: n%5 == 0}
							if readFuzzRequest(r.encode()) != r {
								f.Fatalf("request %+v does not survive its encoding", r)
							}
							at := places[n%len(places)]
							f.Add(r.encode(), at[0], at[1], at[2], script)
							n++
						}
					}
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, p uint16, floor, start, at uint8, script []byte) {
		r := readFuzzRequest(p)
		events := playScript(script)
		m := len(events)
		floorAt := int(floor) % (m + 1)
		startAt := floorAt + int(start)%(m-floorAt+1)
		checkView(t, r, events, floorAt, startAt, int(at)%(startAt+1))
	})
}

// checkView runs one request. The gate's history began after floorAt events
// and has seen all the others; the request is made after startAt; resumed
// watches resume after resumeAt (older than the history when it is below
// floorAt).
func checkView(t *testing.T, r fuzzRequest, events []fuzzEvent, floorAt, startAt, resumeAt int) {
	view, err := NewView(fuzzOwnClass, r.defaultLBs)
	if err != nil {
		t.Fatal(err)
	}
	c := codecs(t)[map[wire.Media]int{wire.MediaJSON: 0, wire.MediaProtobuf: 1}[r.media]]
	rvOf := func(n int) string { return strconv.Itoa(fuzzFirstRV + n) }
	shows := func(s *corev1.Service) bool { return view.Shows(factsOf(s)) }

	if r.list {
		state := stateAfter(events, startAt)
		var want []corev1.Service
		list := &corev1.ServiceList{TypeMeta: metav1.TypeMeta{Kind: "ServiceList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: rvOf(startAt), Continue: "secret-token", RemainingItemCount: ptr.To[int64](7)}}
		for _, s := range sortedServices(state) {
			item := *s
			item.TypeMeta = metav1.TypeMeta{} // the API server's items have none
			list.Items = append(list.Items, item)
			if shows(s) {
				w := item.DeepCopy()
				w.Spec.LoadBalancerClass = nil
				want = append(want, *w)
			}
		}
		p := &testGate{view: view}
		var out bytes.Buffer
		w := bufio.NewWriter(&out)
		if err := p.filterList(r.media, bytes.NewReader(c.Encode(t, list)), w); err != nil {
			t.Fatal(err)
		}
		_ = w.Flush()
		var got corev1.ServiceList
		c.Decode(t, out.Bytes(), &got)
		if !apiequality.Semantic.DeepEqual(got.Items, want) && len(got.Items)+len(want) > 0 {
			t.Fatalf("list: got %v, want %v", got.Items, want)
		}
		if !apiequality.Semantic.DeepEqual(got.ListMeta, metav1.ListMeta{ResourceVersion: rvOf(startAt)}) {
			t.Fatalf("list metadata %+v", got.ListMeta)
		}
		return
	}

	// The history: listed after floorAt events, then every event since.
	h := &History{view: view, passages: map[string][]passage{}, advanced: make(chan struct{})}
	var items []any
	for _, s := range sortedServices(stateAfter(events, floorAt)) {
		hs := service.NewHistoryService(factsOf(s))
		items = append(items, &hs)
	}
	if err := h.Replace(items, rvOf(floorAt)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events[floorAt:] {
		hs := service.NewHistoryService(factsOf(ev.svc))
		if ev.typ == watch.Deleted {
			_ = h.Delete(&hs)
		} else {
			_ = h.Update(&hs)
		}
	}

	// The request, and the API server's answer to it.
	q := url.Values{"watch": {"true"}}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("sendInitialEvents", r.initial)
	set("resourceVersionMatch", r.rvMatch)
	if r.bookmarks {
		q.Set("allowWatchBookmarks", "true")
	}
	resumed := r.rv == "old" || r.rv == "current"
	switch r.rv {
	case "old", "current":
		q.Set("resourceVersion", rvOf(resumeAt))
	default:
		set("resourceVersion", r.rv)
	}
	complete := r.initial == "true" || (r.initial == "" && !resumed)
	var in []watch.Event
	bookmark := func(rv string, end bool) {
		b := &corev1.Service{TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv}}
		if end {
			b.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		}
		in = append(in, watch.Event{Type: watch.Bookmark, Object: b})
	}
	from := startAt // the events after the initial state
	// holds is what the client holds: uid by name.
	holds := map[string]types.UID{}
	switch {
	case complete:
		for _, s := range sortedServices(stateAfter(events, startAt)) {
			in = append(in, watch.Event{Type: watch.Added, Object: s})
		}
		if r.initial == "true" && r.bookmarks {
			bookmark(rvOf(startAt), true)
		}
	case resumed:
		from = resumeAt
		for _, s := range stateAfter(events, resumeAt) {
			if shows(s) {
				holds[s.Name] = s.UID
			}
		}
	default: // from now, without the initial state
		for _, s := range stateAfter(events, startAt) {
			if shows(s) {
				holds[s.Name] = s.UID
			}
		}
	}
	sent := map[string]*corev1.Service{} // the API server's Service by resourceVersion
	for i, ev := range events {
		sent[ev.svc.ResourceVersion] = ev.svc
		if i >= from {
			in = append(in, watch.Event{Type: ev.typ, Object: ev.svc})
			if r.bookmarks && i%3 == 2 {
				bookmark(ev.svc.ResourceVersion, false)
			}
		}
	}
	if r.errorAtEnd {
		in = append(in, watch.Event{Type: watch.Error, Object: &metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError, Message: "internal"}})
	}

	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	if err := FilterWatch(r.media, NewWatchState(view, h, q), bytes.NewReader(c.WatchStream(t, in...)), w); err != nil {
		t.Fatal(err)
	}
	_ = w.Flush()
	ended := false
	for i, ev := range c.ReadWatch(t, out.Bytes()) {
		if ended {
			t.Fatalf("event %d after the view ended the watch", i)
		}
		switch o := ev.Object.(type) {
		case *metav1.Status:
			if ev.Type != watch.Error {
				t.Fatalf("%s with a Status", ev.Type)
			}
			if strings.HasPrefix(o.Message, "ccm-gate:") {
				// Only a watch resumed from before the history.
				if !resumed || resumeAt >= floorAt || o.Code != 410 {
					t.Fatalf("the view ended a watch it can follow: %+v (floor %d, resumed at %d)", o, floorAt, resumeAt)
				}
				ended = true
			} else if !r.errorAtEnd || o.Code != 500 || o.Message != "internal" {
				t.Fatalf("ERROR %+v", o)
			}
		case *corev1.Service:
			checkFuzzEvent(t, ev.Type, o, sent, holds, shows)
		default:
			t.Fatalf("%s with %T", ev.Type, ev.Object)
		}
	}
	if ended {
		return
	}
	want := map[string]types.UID{}
	for _, s := range stateAfter(events, len(events)) {
		if shows(s) {
			want[s.Name] = s.UID
		}
	}
	if !maps.Equal(holds, want) {
		t.Fatalf("the client holds %v, the view is %v\nin:  %v\nout: %v", holds, want, in, c.ReadWatch(t, out.Bytes()))
	}
}

// checkFuzzEvent checks one event the client got and updates what it holds.
func checkFuzzEvent(t *testing.T, typ watch.EventType, o *corev1.Service, sent map[string]*corev1.Service, holds map[string]types.UID, shows func(*corev1.Service) bool) {
	t.Helper()
	if typ == watch.Bookmark {
		end := map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		if o.Name != "" || o.Namespace != "" || o.UID != "" || len(o.Labels) > 0 || o.Spec.Type != "" || o.ResourceVersion == "" ||
			(len(o.Annotations) > 0 && !maps.Equal(o.Annotations, end)) {
			t.Fatalf("bookmark %+v", o)
		}
		return
	}
	orig := sent[o.ResourceVersion]
	if orig == nil || orig.Name != o.Name {
		t.Fatalf("%s %s at %s: the API server sent no such Service", typ, o.Name, o.ResourceVersion)
	}
	tombstone := typ == watch.Deleted && o.Spec.Type == "" && len(o.Labels) == 0
	if tombstone {
		held, ok := holds[o.Name]
		want := &corev1.Service{TypeMeta: o.TypeMeta, ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: o.Name, UID: held, ResourceVersion: o.ResourceVersion}}
		if !ok || !apiequality.Semantic.DeepEqual(o, want) {
			t.Fatalf("tombstone %+v; the client holds %v", o, holds)
		}
		delete(holds, o.Name)
		return
	}
	want := orig.DeepCopy()
	want.Spec.LoadBalancerClass = nil
	if !shows(orig) || !apiequality.Semantic.DeepEqual(o, want) {
		t.Fatalf("%s of a Service in the state %+v (in the view: %v): got %+v", typ, orig, shows(orig), o)
	}
	if typ == watch.Deleted {
		delete(holds, o.Name)
	} else {
		holds[o.Name] = o.UID
	}
}
