package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
	"k8s.io/utils/ptr"
)

// codec is the client side of an encoding, as client-go has it.
type codec struct {
	name  string
	media mediaKind
	info  runtime.SerializerInfo
}

func codecs(t testing.TB) []codec {
	t.Helper()
	var out []codec
	for _, m := range []mediaKind{mediaJSON, mediaProtobuf} {
		info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), m.contentType())
		if !ok {
			t.Fatalf("no serializer for %s", m.contentType())
		}
		out = append(out, codec{name: map[mediaKind]string{mediaJSON: "json", mediaProtobuf: "protobuf"}[m], media: m, info: info})
	}
	return out
}

func (c codec) encode(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := scheme.Codecs.EncoderForVersion(c.info.Serializer, corev1.SchemeGroupVersion)
	if err := enc.Encode(obj, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func (c codec) decode(t testing.TB, b []byte, into runtime.Object) {
	t.Helper()
	dec := scheme.Codecs.DecoderToVersion(c.info.Serializer, corev1.SchemeGroupVersion)
	if _, _, err := dec.Decode(b, nil, into); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
}

// watchStream encodes events as the API server streams them.
func (c codec) watchStream(t testing.TB, events ...watch.Event) []byte {
	t.Helper()
	var b bytes.Buffer
	s := c.info.StreamSerializer
	enc := restclientwatch.NewEncoder(streaming.NewEncoder(s.Framer.NewFrameWriter(&b), s.Serializer),
		scheme.Codecs.EncoderForVersion(c.info.Serializer, corev1.SchemeGroupVersion))
	for _, ev := range events {
		if err := enc.Encode(&ev); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// readWatch decodes a watch stream as client-go does.
func (c codec) readWatch(t testing.TB, b []byte) []watch.Event {
	t.Helper()
	s := c.info.StreamSerializer
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(s.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(b))), s.Serializer),
		scheme.Codecs.DecoderToVersion(c.info.Serializer, corev1.SchemeGroupVersion))
	var out []watch.Event
	for {
		typ, obj, err := dec.Decode()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decode watch stream: %v", err)
		}
		out = append(out, watch.Event{Type: typ, Object: obj})
	}
}

// svc is a Service of the test fixture.
func svc(name, typ string, class *string, finalizers ...string) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ns", UID: "uid-" + "x", ResourceVersion: "7",
			Labels: map[string]string{"app": name}, Annotations: map[string]string{"loadBalancerClass": "not this one"},
			Finalizers: finalizers,
		},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceType(typ), LoadBalancerClass: class,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80}},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}}},
	}
}

// factsOf is what the view should read of s.
func factsOf(s *corev1.Service) serviceFacts {
	f := serviceFacts{
		namespace: s.Namespace, name: s.Name, uid: string(s.UID), resourceVersion: s.ResourceVersion,
		typ: string(s.Spec.Type), cleanup: slices.Contains(s.Finalizers, LoadBalancerCleanupFinalizer),
	}
	if s.Spec.LoadBalancerClass != nil {
		f.class, f.hasClass = *s.Spec.LoadBalancerClass, true
	}
	return f
}

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
		{name: "ClusterIP still with the cleanup finalizer", svc: svc("a", cip, nil, LoadBalancerCleanupFinalizer), class: own, want: true},
		{name: "ClusterIP with another finalizer", svc: svc("a", cip, nil, "x.io/y"), class: own},
		{name: "no class configured: nothing", svc: svc("a", lb, nil), class: ""},
		{name: "no class configured: no cleanup either", svc: svc("a", cip, nil, LoadBalancerCleanupFinalizer), class: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := newServiceView(tc.class, tc.isDefault)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range codecs(t) {
				b := c.encode(t, tc.svc)
				var f serviceFacts
				if c.media == mediaProtobuf {
					o, err := readProtoObject(b)
					if err != nil {
						t.Fatal(err)
					}
					f, err = protoServiceFacts(o.raw)
					if err != nil {
						t.Fatal(err)
					}
				} else if f, err = jsonServiceFacts(b); err != nil {
					t.Fatal(err)
				}
				if f != factsOf(tc.svc) {
					t.Fatalf("%s: facts %+v, want %+v", c.name, f, factsOf(tc.svc))
				}
				if got := v.shows(f); got != tc.want {
					t.Fatalf("%s: shows = %v, want %v", c.name, got, tc.want)
				}
			}
		})
	}
	for _, bad := range []struct{ class string }{{"not a class!"}, {"/x"}} {
		if _, err := newServiceView(bad.class, false); err == nil {
			t.Errorf("class %q accepted", bad.class)
		}
	}
	if _, err := newServiceView("", true); err == nil {
		t.Error("default without a class accepted")
	}
}

func TestServiceWithoutClass(t *testing.T) {
	for _, c := range codecs(t) {
		t.Run(c.name, func(t *testing.T) {
			for _, in := range []*corev1.Service{svc("a", "LoadBalancer", ptr.To("x.io/a")), svc("b", "LoadBalancer", nil)} {
				b := c.encode(t, in)
				var out []byte
				var err error
				if c.media == mediaProtobuf {
					o, _ := readProtoObject(b)
					var raw []byte
					if raw, err = protoServiceWithoutClass(o.raw); err == nil {
						out, err = rewrapProtoObject(b, raw)
					}
				} else {
					out, err = jsonServiceWithoutClass(b)
				}
				if err != nil {
					t.Fatal(err)
				}
				var got corev1.Service
				c.decode(t, out, &got)
				want := in.DeepCopy()
				want.Spec.LoadBalancerClass = nil
				if !apiequality.Semantic.DeepEqual(&got, want) {
					t.Fatalf("got %+v\nwant %+v", got, want)
				}
			}
		})
	}
	// Members around the class, in every position, keep valid JSON.
	for _, in := range []string{
		`{"spec":{"loadBalancerClass":"x"}}`,
		`{"spec":{"loadBalancerClass":"x","type":"LoadBalancer"}}`,
		`{"spec":{"type":"LoadBalancer", "loadBalancerClass" : "x" }}`,
		`{"spec":{"a":1,"loadBalancerClass":"x","b":[1,{"c":"}"}]}}`,
		`{"spec":{"loadBalancerClass":"x","loadBalancerClass":"y"},"status":{}}`,
		`{"spec":{"lo\u0061dBalancerClass":"x"}}`,
	} {
		out, err := jsonServiceWithoutClass([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		f, err := jsonServiceFacts(out)
		if err != nil || f.hasClass || !isJSON(out) {
			t.Fatalf("%s -> %s: %+v %v", in, out, f, err)
		}
	}
}

func isJSON(b []byte) bool {
	end, err := jsonValueEnd(b, skipJSONSpace(b, 0))
	return err == nil && skipJSONSpace(b, end) == len(b) && bytes.Count(b, []byte("{")) >= 1
}

func TestServiceForWrite(t *testing.T) {
	const class = "hybridccm.io/hcloud"
	for _, c := range codecs(t) {
		t.Run(c.name, func(t *testing.T) {
			tests := []struct {
				name string
				// sent is what the CCM PUTs; stored the class on the server.
				sent     *corev1.Service
				hasClass bool
				// wantRV is the resourceVersion the forwarded body carries.
				wantRV string
				// refused: the gate answers 403.
				refused bool
			}{
				{name: "class restored, resourceVersion kept", sent: svc("a", "LoadBalancer", nil), hasClass: true, wantRV: "7"},
				{name: "classless Service stays classless", sent: svc("a", "LoadBalancer", nil), wantRV: "7"},
				{name: "unconditional PUT made conditional", sent: func() *corev1.Service {
					s := svc("a", "LoadBalancer", nil)
					s.ResourceVersion = ""
					return s
				}(), hasClass: true, wantRV: "42"},
				{name: "the stored class may be sent back", sent: svc("a", "LoadBalancer", ptr.To(class)), hasClass: true, wantRV: "7"},
				{name: "another class is refused", sent: svc("a", "LoadBalancer", ptr.To("x.io/other")), hasClass: true, refused: true},
				{name: "a class on a classless Service is refused", sent: svc("a", "LoadBalancer", ptr.To(class)), refused: true},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					b := c.encode(t, tc.sent)
					var out []byte
					var err error
					storedClass := ""
					if tc.hasClass {
						storedClass = class
					}
					if c.media == mediaProtobuf {
						o, _ := readProtoObject(b)
						var raw []byte
						if raw, err = protoServiceForWrite(o.raw, storedClass, tc.hasClass, "42"); err == nil {
							out, err = rewrapProtoObject(b, raw)
						}
					} else {
						out, err = jsonServiceForWrite(b, storedClass, tc.hasClass, "42")
					}
					var ce *classError
					if tc.refused {
						if !errors.As(err, &ce) {
							t.Fatalf("want a class error, got %v", err)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					var got corev1.Service
					c.decode(t, out, &got)
					want := tc.sent.DeepCopy()
					want.ResourceVersion = tc.wantRV
					if tc.hasClass {
						want.Spec.LoadBalancerClass = ptr.To(class)
					}
					if !apiequality.Semantic.DeepEqual(&got, want) {
						t.Fatalf("got %+v\nwant %+v", got, want)
					}
				})
			}
		})
	}
	for _, in := range []string{
		`{"metadata":{"name":"a"},"spec":{},"spec":{}}`,
		`{"metadata":{"name":"a"},"metadata":{"name":"b"}}`,
		`{"metadata":{"name":"a","resourceVersion":"1","resourceVersion":""}}`,
		`{"metadata":{"name":"a"},"spec":{"loadBalancerClass":null,"loadBalancerClass":null}}`,
	} {
		if _, err := jsonServiceForWrite([]byte(in), class, true, "1"); err == nil {
			t.Errorf("%s accepted", in)
		}
	}
	// A null class and an empty resourceVersion are filled in place.
	out, err := jsonServiceForWrite([]byte(`{"metadata":{"resourceVersion":"","name":"a"},"spec":{"type":"LoadBalancer","loadBalancerClass":null}}`), class, true, "9")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"metadata":{"resourceVersion":"9","name":"a"},"spec":{"type":"LoadBalancer","loadBalancerClass":"hybridccm.io/hcloud"}}`; string(out) != want {
		t.Fatalf("got %s\nwant %s", out, want)
	}
}

func testProxy(t testing.TB, class string, isDefault bool) *Proxy {
	t.Helper()
	v, err := newServiceView(class, isDefault)
	if err != nil {
		t.Fatal(err)
	}
	return &Proxy{serviceView: v}
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
		t.Run(c.name, func(t *testing.T) {
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
				filter := p.filterJSONList
				if c.media == mediaProtobuf {
					filter = p.filterProtoList
				}
				// One byte at a time: every boundary falls inside a read.
				if err := filter(&oneByteReader{r: bytes.NewReader(c.encode(t, list))}, w); err != nil {
					t.Fatal(err)
				}
				_ = w.Flush()
				var got corev1.ServiceList
				c.decode(t, out.Bytes(), &got)
				var names []string
				for _, s := range got.Items {
					names = append(names, s.Name)
					if s.Spec.LoadBalancerClass != nil || len(s.Status.LoadBalancer.Ingress) != 1 || s.Labels["app"] != s.Name {
						t.Fatalf("item %+v", s)
					}
				}
				if !slices.Equal(names, tc.want) || got.ResourceVersion != "99" || got.Continue != "token" || got.RemainingItemCount != nil {
					t.Fatalf("got %v %+v", names, got.ListMeta)
				}
			}
			// The view without a class: an empty list, same resourceVersion.
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
			p := testProxy(t, "", false)
			filter := p.filterJSONList
			if c.media == mediaProtobuf {
				filter = p.filterProtoList
			}
			if err := filter(bytes.NewReader(c.encode(t, list)), w); err != nil {
				t.Fatal(err)
			}
			_ = w.Flush()
			var got corev1.ServiceList
			c.decode(t, out.Bytes(), &got)
			if len(got.Items) != 0 || got.ResourceVersion != "99" {
				t.Fatalf("hidden view: %+v", got)
			}
		})
	}
	// Truncated and malformed lists are errors, never a partial answer.
	for _, c := range codecs(t) {
		b := bytes.TrimSpace(c.encode(t, list))
		for _, cut := range []int{1, 10, len(b) / 2, len(b) - 1} {
			p := testProxy(t, own, false)
			filter := p.filterJSONList
			if c.media == mediaProtobuf {
				filter = p.filterProtoList
			}
			if err := filter(bytes.NewReader(b[:cut]), bufio.NewWriter(io.Discard)); err == nil {
				t.Errorf("%s cut at %d: no error", c.name, cut)
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
		{Type: watch.Modified, Object: lb("own", ptr.To(own), "12", LoadBalancerCleanupFinalizer)},
		{Type: watch.Modified, Object: lb("aws", ptr.To("hybridccm.io/aws"), "13")},
		// Type changed: the class is gone, the finalizer holds it in the view
		// until its owner has deleted the load balancer.
		{Type: watch.Modified, Object: cip("own", "14", LoadBalancerCleanupFinalizer)},
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
		t.Run(c.name, func(t *testing.T) {
			p := testProxy(t, own, false)
			s := p.newWatchState(map[string][]string{"sendInitialEvents": {"true"}})
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
			filter := s.filterJSON
			if c.media == mediaProtobuf {
				filter = s.filterProto
			}
			if err := filter(&oneByteReader{r: bytes.NewReader(c.watchStream(t, in...))}, w); err != nil {
				t.Fatal(err)
			}
			_ = w.Flush()
			var got []string
			for _, ev := range c.readWatch(t, out.Bytes()) {
				switch o := ev.Object.(type) {
				case *corev1.Service:
					if o.Spec.LoadBalancerClass != nil {
						t.Fatalf("class shown: %+v", o)
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
	in := serviceFacts{namespace: "ns", name: "a", typ: "LoadBalancer", class: own, hasClass: true, resourceVersion: "50"}
	out := serviceFacts{namespace: "ns", name: "a", typ: "LoadBalancer", class: "x.io/y", hasClass: true, resourceVersion: "50"}
	history := &serviceHistory{isSynced: true, floor: 5, horizon: 100, shown: map[string]*shownService{"ns/shown": {first: 7, firstSet: true}, "ns/later": {first: 60, firstSet: true}, "ns/gone": {goneAt: 20}}, advanced: make(chan struct{})}
	tests := []struct {
		name string
		// query starts the watch; history may be nil.
		query   map[string][]string
		history *serviceHistory
		// event and facts are the API server's first event about a Service.
		event string
		facts serviceFacts
		// want is the event the client gets ("" none).
		want string
	}{
		{name: "resumed: own Service modified", query: rv("10"), event: eventModified, facts: in, want: eventModified},
		{name: "resumed: own Service created", query: rv("10"), event: eventAdded, facts: in, want: eventAdded},
		{name: "resumed: foreign Service created", query: rv("10"), event: eventAdded, facts: out},
		{name: "resumed: foreign Service deleted", query: rv("10"), event: eventDeleted, facts: out},
		{name: "resumed: own Service deleted", query: rv("10"), event: eventDeleted, facts: in, want: eventDeleted},
		{name: "resumed, no history: foreign Service modified may have left", query: rv("10"), event: eventModified, facts: out, want: eventDeleted},
		{name: "resumed, history: never shown", query: rv("10"), history: history, event: eventModified, facts: out},
		{name: "resumed, history: shown before", query: rv("10"), history: history, event: eventModified,
			facts: serviceFacts{namespace: "ns", name: "shown", typ: "ClusterIP", resourceVersion: "50"}, want: eventDeleted},
		{name: "resumed, history: in the view only since after the watch's version", query: rv("10"), history: history, event: eventModified,
			facts: serviceFacts{namespace: "ns", name: "later", typ: "ClusterIP", resourceVersion: "70"}},
		{name: "resumed, history: enters the view", query: rv("10"), history: history, event: eventModified,
			facts: serviceFacts{namespace: "ns", name: "entering", typ: "LoadBalancer", class: own, hasClass: true, resourceVersion: "50"}, want: eventAdded},
		{name: "resumed, history: an earlier incarnation in the view deleted since", query: rv("10"), history: history, event: eventModified,
			facts: serviceFacts{namespace: "ns", name: "gone", typ: "ClusterIP", resourceVersion: "50"}, want: eventDeleted},
		{name: "resumed, history: an earlier incarnation in the view deleted before", query: rv("30"), history: history, event: eventModified,
			facts: serviceFacts{namespace: "ns", name: "gone", typ: "ClusterIP", resourceVersion: "50"}},
		{name: "resumed before the history began", query: rv("3"), history: history, event: eventModified, facts: out, want: eventDeleted},
		{name: "event after the history's horizon (it never catches up)", query: rv("10"), history: history, event: eventModified,
			facts: serviceFacts{namespace: "ns", name: "a", typ: "ClusterIP", resourceVersion: "150"}, want: eventDeleted},
		{name: "legacy watch with initial state", query: rv("0"), event: eventModified, facts: out},
		{name: "legacy watch from now", query: map[string][]string{}, event: eventModified, facts: out},
		{name: "sendInitialEvents=false from now", query: map[string][]string{"sendInitialEvents": {"false"}}, event: eventModified, facts: out, want: eventDeleted},
		{name: "WatchList: own Service enters the view", query: map[string][]string{"sendInitialEvents": {"true"}, "resourceVersion": {"10"}}, event: eventModified, facts: in, want: eventAdded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := testProxy(t, own, false)
			p.history = tc.history
			s := p.newWatchState(tc.query)
			got, send := s.decide(tc.event, tc.facts)
			if !send {
				got = ""
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	// The view without a class never names a Service.
	s := testProxy(t, "", false).newWatchState(rv("10"))
	if _, send := s.decide(eventModified, out); send {
		t.Fatal("hidden view sent an event")
	}
}

func rv(v string) map[string][]string { return map[string][]string{"resourceVersion": {v}} }

func TestNegotiateMedia(t *testing.T) {
	tests := []struct {
		accept string
		want   mediaKind
	}{
		{accept: "", want: mediaJSON},
		{accept: "application/json", want: mediaJSON},
		{accept: "application/vnd.kubernetes.protobuf, */*", want: mediaProtobuf},
		{accept: "application/vnd.kubernetes.protobuf;stream=watch", want: mediaProtobuf},
		{accept: "application/json;as=Table;v=v1;g=meta.k8s.io,application/json", want: mediaJSON},
		{accept: "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"},
		{accept: "application/cbor"},
		{accept: "application/cbor, application/json;q=0.9", want: mediaJSON},
		{accept: "application/json;q=0.5, application/vnd.kubernetes.protobuf", want: mediaProtobuf},
		{accept: "application/json;q=0", want: mediaNone},
		{accept: "*/*", want: mediaJSON},
		{accept: "text/html", want: mediaNone},
		{accept: ";;;,", want: mediaNone},
	}
	for _, tc := range tests {
		got, ok := negotiateMedia([]string{tc.accept})
		if got != tc.want || ok != (tc.want != mediaNone) {
			t.Errorf("Accept %q: got %v %v, want %v", tc.accept, got, ok, tc.want)
		}
	}
}

// FuzzServiceWire feeds arbitrary bytes to every reader of the Service view:
// errors are fine, panics are not.
func FuzzServiceWire(f *testing.F) {
	for _, c := range codecs(f) {
		s := svc("a", "LoadBalancer", ptr.To("x.io/a"), LoadBalancerCleanupFinalizer)
		f.Add(c.encode(f, s))
		f.Add(c.encode(f, &corev1.ServiceList{Items: []corev1.Service{*s}}))
		f.Add(c.watchStream(f, watch.Event{Type: watch.Modified, Object: s}))
	}
	f.Add([]byte(`{"spec":{"loadBalancerClass":"\"}`))
	f.Add([]byte(`[[[[{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := testProxy(t, "x.io/a", true)
		_, _ = jsonServiceFacts(b)
		_, _ = jsonServiceWithoutClass(b)
		_, _ = jsonServiceForWrite(b, "x.io/a", true, "1")
		_, _ = protoServiceFacts(b)
		_, _ = protoServiceWithoutClass(b)
		_, _ = protoServiceForWrite(b, "x.io/a", true, "1")
		if o, err := readProtoObject(b); err == nil {
			_, _ = rewrapProtoObject(b, o.raw)
		}
		_ = p.filterJSONList(bytes.NewReader(b), bufio.NewWriter(io.Discard))
		_ = p.filterProtoList(bytes.NewReader(b), bufio.NewWriter(io.Discard))
		_ = p.newWatchState(nil).filterJSON(bytes.NewReader(b), bufio.NewWriter(io.Discard))
		_ = p.newWatchState(nil).filterProto(bytes.NewReader(b), bufio.NewWriter(io.Discard))
	})
}

// TestFilterWatchJSONMemberOrder: an event whose object comes before its type
// (the API server writes the type first) is read all the same.
func TestFilterWatchJSONMemberOrder(t *testing.T) {
	const own = "hybridccm.io/hcloud"
	in := `{"object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","resourceVersion":"5"},"spec":{"type":"LoadBalancer","loadBalancerClass":"` + own + `","ports":[{"port":80}]}},"type":"ADDED"}` + "\n" +
		`{"type":"ADDED","object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"b","namespace":"ns","resourceVersion":"6"},"spec":{"loadBalancerClass":"x.io/other","type":"LoadBalancer"}}}`
	s := testProxy(t, own, false).newWatchState(map[string][]string{"resourceVersion": {"0"}})
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	if err := s.filterJSON(strings.NewReader(in), w); err != nil {
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
		if err := protoFields(out.Bytes(), func(f protoField) error {
			if f.num != pbListPadding {
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
