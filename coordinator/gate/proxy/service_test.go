package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
	"k8s.io/utils/ptr"
	sjson "sigs.k8s.io/json"
)

// codec is the client side of an encoding, as client-go has it.
type codec struct {
	name  string
	media wire.Media
	info  runtime.SerializerInfo
}

func codecs(t testing.TB) []codec {
	t.Helper()
	var out []codec
	for _, m := range []wire.Media{wire.MediaJSON, wire.MediaProtobuf} {
		info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), m.ContentType())
		if !ok {
			t.Fatalf("no serializer for %s", m.ContentType())
		}
		out = append(out, codec{name: map[wire.Media]string{wire.MediaJSON: "json", wire.MediaProtobuf: "protobuf"}[m], media: m, info: info})
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

// scan reads an encoded Service (as the API server answers a get) with the
// object layer, names and versions included.
func (c codec) scan(t testing.TB, b []byte) *service {
	t.Helper()
	s, err := scanService(c.media, b)
	if err != nil {
		t.Fatalf("scan %q: %v", b, err)
	}
	return s
}

// scanService reads an encoded Service: JSON, or protobuf in its envelope.
func scanService(media wire.Media, b []byte) (*service, error) { return readOne(media, b, "") }

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
				f := c.scan(t, c.encode(t, tc.svc)).serviceFacts
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
				out := singleAnswer(c.media, c.scan(t, c.encode(t, in)))
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
		`{"spec":{"a":1 , "loadBalancerClass":"x" , "b":2}}`,
		`{"spec":{"lo\u0061dBalancerClass":"x"}}`,
	} {
		out := singleAnswer(wire.MediaJSON, mustScanJSON(t, in))
		f := mustScanJSON(t, string(out))
		if f.hasClass || !isJSON(out) {
			t.Fatalf("%s -> %s: %+v", in, out, f)
		}
	}
	// A Service that repeats what the view decides on is refused: which one
	// counts would be up to the decoder.
	for _, in := range []string{
		`{"spec":{"loadBalancerClass":"x","loadBalancerClass":"y"},"status":{}}`,
		`{"spec":{"type":"ClusterIP","type":"LoadBalancer"}}`,
		`{"spec":{},"spec":{"type":"LoadBalancer"}}`,
		`{"metadata":{},"metadata":{"finalizers":[]}}`,
		`{"metadata":{"finalizers":[],"finalizers":["x"]}}`,
	} {
		if _, err := scanService(wire.MediaJSON, []byte(in)); !errors.Is(err, errRepeated) {
			t.Errorf("%s: %v, want errRepeated", in, err)
		}
	}
}

func mustScanJSON(t *testing.T, in string) *service {
	t.Helper()
	s, err := scanService(wire.MediaJSON, []byte(in))
	if err != nil {
		t.Fatalf("%s: %v", in, err)
	}
	return s
}

func isJSON(b []byte) bool {
	end, err := wire.JSONValueEnd(b, wire.SkipJSONSpace(b, 0))
	return err == nil && wire.SkipJSONSpace(b, end) == len(b) && bytes.Count(b, []byte("{")) >= 1
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
					if c.media == wire.MediaProtobuf {
						o, _ := wire.ReadProtoObject(b)
						var raw []byte
						if raw, err = protoServiceForWrite(o.Raw, storedClass, tc.hasClass, "42"); err == nil {
							out, err = wire.RewrapProtoObject(b, raw)
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

// watchState starts the state of a watch of p's view with the query q.
func (p *Proxy) watchState(q url.Values) *watchState {
	return newWatchState(p.serviceView, p.history, q)
}

// listFilter is the view's filter of a list in c's encoding.
func (c codec) listFilter(p *Proxy) func(io.Reader, *bufio.Writer) error {
	return func(in io.Reader, out *bufio.Writer) error { return p.filterList(c.media, in, out) }
}

// watchFilter is the view's filter of a watch in c's encoding.
func (c codec) watchFilter(s *watchState) func(io.Reader, *bufio.Writer) error {
	return func(in io.Reader, out *bufio.Writer) error { return filterWatch(c.media, s, in, out) }
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
				filter := c.listFilter(p)
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
				// Of the list's metadata only the resourceVersion passes.
				if !slices.Equal(names, tc.want) || !apiequality.Semantic.DeepEqual(got.ListMeta, metav1.ListMeta{ResourceVersion: "99"}) {
					t.Fatalf("got %v %+v", names, got.ListMeta)
				}
			}
			// The view without a class: an empty list, same resourceVersion.
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
			filter := c.listFilter(testProxy(t, "", false))
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
			filter := c.listFilter(testProxy(t, own, false))
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
			filter := c.watchFilter(p.watchState(map[string][]string{"sendInitialEvents": {"true"}}))
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
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
	svcAt := func(name, typ, class, rv string) *service {
		f := serviceFacts{namespace: "ns", name: name, uid: "uid-" + name, typ: typ, resourceVersion: rv}
		if class != "" {
			f.class, f.hasClass = class, true
		}
		return &service{serviceFacts: f}
	}
	in := svcAt("a", "LoadBalancer", own, "50")
	out := svcAt("a", "LoadBalancer", "x.io/y", "50")
	// The history: shown was in the view from 7 on, later from 60 on, gone
	// from 7 to 20, left from 8 to 30.
	history := &serviceHistory{isSynced: true, floor: 5, horizon: 100, advanced: make(chan struct{}), passages: map[string][]passage{
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
		svc   *service
		// want is the event the client gets ("" none), tombstone whether it
		// carries a tombstone (else the Service).
		want      string
		tombstone bool
		// uid is the tombstone's.
		uid string
	}{
		{name: "resumed: own Service modified", query: rv("10"), event: eventModified, svc: in, want: eventModified},
		{name: "resumed: own Service created", query: rv("10"), event: eventAdded, svc: in, want: eventAdded},
		{name: "resumed: own Service deleted", query: rv("10"), event: eventDeleted, svc: in, want: eventDeleted},
		{name: "resumed: foreign Service created", query: rv("10"), event: eventAdded, svc: out},
		{name: "resumed: foreign Service modified", query: rv("10"), event: eventModified, svc: out},
		{name: "resumed: foreign Service deleted", query: rv("10"), event: eventDeleted, svc: out},
		{name: "resumed: in the view before, left now", query: rv("10"), event: eventModified,
			svc: svcAt("shown", "ClusterIP", "", "50"), want: eventDeleted, tombstone: true, uid: "uid-old"},
		{name: "resumed: deleted now, after it left the view", query: rv("10"), event: eventDeleted,
			svc: svcAt("shown", "ClusterIP", "", "50"), want: eventDeleted, tombstone: true, uid: "uid-old"},
		{name: "resumed: in the view only from after the event", query: rv("10"), event: eventModified,
			svc: svcAt("later", "ClusterIP", "", "55")},
		{name: "resumed: in the view just before the event", query: rv("10"), event: eventModified,
			svc: svcAt("later", "ClusterIP", "", "70"), want: eventDeleted, tombstone: true, uid: "uid-later"},
		{name: "resumed: left the view before the event", query: rv("10"), event: eventModified,
			svc: svcAt("left", "ClusterIP", "", "40")},
		{name: "resumed: left the view with this event", query: rv("10"), event: eventModified,
			svc: svcAt("left", "ClusterIP", "", "30"), want: eventDeleted, tombstone: true, uid: "uid-left"},
		{name: "resumed: enters the view", query: rv("10"), event: eventModified,
			svc: svcAt("entering", "LoadBalancer", own, "50"), want: eventModified},
		{name: "event older than the history: the watch ends", query: rv("3"), event: eventModified,
			svc: svcAt("secret-name", "ClusterIP", "", "4"), want: eventError},
		{name: "event past the history's horizon (it never catches up): the watch ends", query: rv("10"), event: eventModified,
			svc: svcAt("secret-name", "ClusterIP", "", "150"), want: eventError},
		{name: "event without a resourceVersion: the watch ends", query: rv("10"), event: eventModified,
			svc: svcAt("secret-name", "ClusterIP", "", ""), want: eventError},
		{name: "legacy watch with initial state: foreign", query: rv("0"), event: eventModified, svc: svcAt("shown", "ClusterIP", "", "50")},
		{name: "legacy watch from now: foreign", query: map[string][]string{}, event: eventModified, svc: svcAt("shown", "ClusterIP", "", "50")},
		{name: "legacy watch: own Service enters", query: map[string][]string{}, event: eventModified, svc: in, want: eventAdded},
		{name: "sendInitialEvents=false from now: foreign", query: map[string][]string{"sendInitialEvents": {"false"}}, event: eventModified, svc: out},
		{name: "sendInitialEvents=false from now: left the view", query: map[string][]string{"sendInitialEvents": {"false"}}, event: eventModified,
			svc: svcAt("shown", "ClusterIP", "", "50"), want: eventDeleted, tombstone: true, uid: "uid-old"},
		{name: "WatchList: own Service enters the view", query: map[string][]string{"sendInitialEvents": {"true"}, "resourceVersion": {"10"}}, event: eventModified, svc: in, want: eventAdded},
		{name: "WatchList: foreign Service shown before", query: map[string][]string{"sendInitialEvents": {"true"}}, event: eventModified, svc: svcAt("shown", "ClusterIP", "", "50")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := testProxy(t, own, false)
			p.history = history
			s := p.watchState(tc.query)
			got, err := s.decide(watchEvent{typ: tc.event, svc: tc.svc})
			if err != nil {
				t.Fatal(err)
			}
			if got.typ != tc.want || (got.kind == sendTombstone) != tc.tombstone || got.meta.uid != tc.uid {
				t.Fatalf("got %+v, want %q (tombstone %v, uid %q)", got, tc.want, tc.tombstone, tc.uid)
			}
			if got.kind == sendStatus && (!got.last || got.status.Code != 410 || strings.Contains(got.status.Message, tc.svc.name)) {
				t.Fatalf("a watch the view cannot continue: %+v", got)
			}
			if got.kind == sendTombstone && (got.meta.name != tc.svc.name || got.meta.resourceVersion != tc.svc.resourceVersion || got.meta.typ != "") {
				t.Fatalf("tombstone %+v", got.meta)
			}
		})
	}
	// The view without a class never names a Service, and needs no history.
	s := testProxy(t, "", false).watchState(rv("10"))
	for _, ev := range []string{eventAdded, eventModified, eventDeleted} {
		if got, err := s.decide(watchEvent{typ: ev, svc: in}); err != nil || got.kind != sendNothing {
			t.Fatalf("hidden view: %+v %v", got, err)
		}
	}
}

func rv(v string) map[string][]string { return map[string][]string{"resourceVersion": {v}} }

func TestNegotiateMedia(t *testing.T) {
	tests := []struct {
		accept string
		want   wire.Media
	}{
		{accept: "", want: wire.MediaJSON},
		{accept: "application/json", want: wire.MediaJSON},
		{accept: "application/vnd.kubernetes.protobuf, */*", want: wire.MediaProtobuf},
		{accept: "application/vnd.kubernetes.protobuf;stream=watch", want: wire.MediaProtobuf},
		{accept: "application/json;as=Table;v=v1;g=meta.k8s.io,application/json", want: wire.MediaJSON},
		{accept: "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"},
		{accept: "application/cbor"},
		{accept: "application/cbor, application/json;q=0.9", want: wire.MediaJSON},
		{accept: "application/json;q=0.5, application/vnd.kubernetes.protobuf", want: wire.MediaProtobuf},
		{accept: "application/json;q=0", want: wire.MediaNone},
		{accept: "*/*", want: wire.MediaJSON},
		{accept: "text/html", want: wire.MediaNone},
		{accept: ";;;,", want: wire.MediaNone},
	}
	for _, tc := range tests {
		got, ok := negotiateMedia([]string{tc.accept})
		if got != tc.want || ok != (tc.want != wire.MediaNone) {
			t.Errorf("Accept %q: got %v %v, want %v", tc.accept, got, ok, tc.want)
		}
	}
}

// TestPlainPreferred: a GET of a Node is checked by its answer only when the
// API server would answer it as a plain Node anyway; any header with which it
// might answer in another form is held (nodehold.go) and forwarded as sent.
func TestPlainPreferred(t *testing.T) {
	tests := []struct {
		accept string
		want   wire.Media // mediaNone: held
	}{
		{accept: "", want: wire.MediaJSON},
		{accept: "application/json", want: wire.MediaJSON},
		{accept: "application/vnd.kubernetes.protobuf,application/json", want: wire.MediaProtobuf},
		{accept: "application/vnd.kubernetes.protobuf, */*", want: wire.MediaProtobuf},
		{accept: "*/*", want: wire.MediaJSON},
		{accept: "application/json, application/yaml;q=0.5", want: wire.MediaJSON},
		{accept: "application/json;q=0.9, application/json;as=Table;v=v1;g=meta.k8s.io;q=0.8", want: wire.MediaJSON},
		{accept: "application/json, application/cbor;q=0", want: wire.MediaJSON},
		// kubectl get node, client-go's metadata client
		{accept: "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"},
		{accept: "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"},
		{accept: "application/yaml"},
		{accept: "application/cbor"},
		{accept: "application/json;as=Table;v=v1;g=meta.k8s.io"},
		// a tie: the API server's order is not the header's
		{accept: "application/json, application/yaml"},
		// wildcards go last at the API server
		{accept: "*/*, application/yaml"},
		{accept: "application/json;q=0.5, application/yaml;q=0.5"},
		// what the gate cannot read, the API server reads its own way
		{accept: "application/json, application/yaml;q=2"},
		{accept: "application/json, application/yaml;q=x"},
		{accept: "application/json, ;;;"},
		// nothing plain: the API server decides (406, or another form)
		{accept: "application/json;q=0"},
		{accept: "text/html"},
	}
	for _, tc := range tests {
		got, ok := plainPreferred([]string{tc.accept})
		if got != tc.want || ok != (tc.want != wire.MediaNone) {
			t.Errorf("Accept %q: got %v %v, want %v", tc.accept, got, ok, tc.want)
		}
	}
}

// FuzzServiceWire feeds arbitrary bytes to every reader of the Service view:
// errors are fine, panics are not. Where client-go's own decoder reads the
// bytes as a Service, the view must read the same facts from them, and the
// Service it writes without its class must decode to the same Service
// without its class.
func FuzzServiceWire(f *testing.F) {
	for _, c := range codecs(f) {
		s := svc("a", "LoadBalancer", ptr.To("x.io/a"), LoadBalancerCleanupFinalizer)
		b := c.encode(f, s)
		if c.media == wire.MediaProtobuf {
			o, _ := wire.ReadProtoObject(b)
			f.Add(o.Raw)
		}
		f.Add(b)
		f.Add(c.encode(f, &corev1.ServiceList{Items: []corev1.Service{*s}}))
		f.Add(c.watchStream(f, watch.Event{Type: watch.Modified, Object: s}))
	}
	f.Add([]byte(`{"spec":{"loadBalancerClass":"\"}`))
	f.Add([]byte(`{"spec":{"a":1 , "loadBalancerClass":"x" , "b":2},"metadata":{"finalizers":["service.kubernetes.io/load-balancer-cleanup"]}}`))
	f.Add([]byte(`[[[[{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := testProxy(t, "x.io/a", true)
		_, _ = jsonServiceForWrite(b, "x.io/a", true, "1")
		_, _ = protoServiceForWrite(b, "x.io/a", true, "1")
		if o, err := wire.ReadProtoObject(b); err == nil {
			_, _ = wire.RewrapProtoObject(b, o.Raw)
		}
		for _, media := range []wire.Media{wire.MediaJSON, wire.MediaProtobuf} {
			_ = p.filterList(media, bytes.NewReader(b), bufio.NewWriter(io.Discard))
			for _, q := range []url.Values{nil, {"sendInitialEvents": {"true"}}, {"resourceVersion": {"5"}}} {
				_ = filterWatch(media, p.watchState(q), bytes.NewReader(b), bufio.NewWriter(io.Discard))
			}
		}
		js := jsonServiceScanner{meta: true}
		if svc, err := js.scan(b); err == nil {
			var want corev1.Service
			if sjson.UnmarshalCaseSensitivePreserveInts(b, &want) == nil {
				checkScanned(t, "JSON", svc, &want, func(out []byte, into *corev1.Service) error {
					return sjson.UnmarshalCaseSensitivePreserveInts(out, into)
				})
			}
		}
		ps := protoServiceScanner{meta: true}
		if svc, err := ps.scan(b); err == nil {
			var want corev1.Service
			if want.Unmarshal(b) == nil {
				checkScanned(t, "protobuf", svc, &want, func(out []byte, into *corev1.Service) error { return into.Unmarshal(out) })
			}
		}
	})
}

// checkScanned compares what the view read of a Service with what client-go
// decodes: the facts, and the Service written without its class.
func checkScanned(t *testing.T, what string, svc *service, want *corev1.Service, decode func([]byte, *corev1.Service) error) {
	t.Helper()
	f := factsOf(want)
	f.initialEventsEnd = want.Annotations[metav1.InitialEventsAnnotationKey] == "true"
	if svc.serviceFacts != f {
		t.Fatalf("%s: the view read %+v, the client decodes %+v", what, svc.serviceFacts, f)
	}
	out := svc.appendWithoutClass(nil)
	var got corev1.Service
	if err := decode(out, &got); err != nil {
		t.Fatalf("%s: the Service without its class does not decode: %v\n%q", what, err, out)
	}
	want = want.DeepCopy()
	want.Spec.LoadBalancerClass = nil
	if !apiequality.Semantic.DeepEqual(&got, want) {
		t.Fatalf("%s: without its class\n got %+v\nwant %+v", what, got, want)
	}
}

// TestFilterWatchJSONMemberOrder: an event whose object comes before its type
// (the API server writes the type first) is read all the same.
func TestFilterWatchJSONMemberOrder(t *testing.T) {
	const own = "hybridccm.io/hcloud"
	in := `{"object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","resourceVersion":"5"},"spec":{"type":"LoadBalancer","loadBalancerClass":"` + own + `","ports":[{"port":80}]}},"type":"ADDED"}` + "\n" +
		`{"type":"ADDED","object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"b","namespace":"ns","resourceVersion":"6"},"spec":{"loadBalancerClass":"x.io/other","type":"LoadBalancer"}}}`
	s := testProxy(t, own, false).watchState(map[string][]string{"resourceVersion": {"0"}})
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	if err := filterWatch(wire.MediaJSON, s, strings.NewReader(in), w); err != nil {
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
