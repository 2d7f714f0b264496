package service_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/url"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	sjson "sigs.k8s.io/json"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/internal/servicetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/serviceview"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

func TestServiceWithoutClass(t *testing.T) {
	for _, c := range servicetest.Codecs(t) {
		t.Run(c.Name, func(t *testing.T) {
			for _, in := range []*corev1.Service{servicetest.Svc("a", "LoadBalancer", ptr.To("x.io/a")), servicetest.Svc("b", "LoadBalancer", nil)} {
				out := serviceview.SingleAnswer(c.Media, c.Scan(t, c.Encode(t, in)))
				var got corev1.Service
				c.Decode(t, out, &got)
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
		out := serviceview.SingleAnswer(wire.MediaJSON, mustScanJSON(t, in))
		f := mustScanJSON(t, string(out))
		if f.HasClass || !isJSON(out) {
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
		if _, err := servicetest.ScanService(wire.MediaJSON, []byte(in)); !errors.Is(err, service.ErrRepeated) {
			t.Errorf("%s: %v, want errRepeated", in, err)
		}
	}
}

func mustScanJSON(t *testing.T, in string) *service.Service {
	t.Helper()
	s, err := servicetest.ScanService(wire.MediaJSON, []byte(in))
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
	for _, c := range servicetest.Codecs(t) {
		t.Run(c.Name, func(t *testing.T) {
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
				{name: "class restored, resourceVersion kept", sent: servicetest.Svc("a", "LoadBalancer", nil), hasClass: true, wantRV: "7"},
				{name: "classless Service stays classless", sent: servicetest.Svc("a", "LoadBalancer", nil), wantRV: "7"},
				{name: "unconditional PUT made conditional", sent: func() *corev1.Service {
					s := servicetest.Svc("a", "LoadBalancer", nil)
					s.ResourceVersion = ""
					return s
				}(), hasClass: true, wantRV: "42"},
				{name: "the stored class may be sent back", sent: servicetest.Svc("a", "LoadBalancer", ptr.To(class)), hasClass: true, wantRV: "7"},
				{name: "another class is refused", sent: servicetest.Svc("a", "LoadBalancer", ptr.To("x.io/other")), hasClass: true, refused: true},
				{name: "a class on a classless Service is refused", sent: servicetest.Svc("a", "LoadBalancer", ptr.To(class)), refused: true},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					b := c.Encode(t, tc.sent)
					var out []byte
					var err error
					storedClass := ""
					if tc.hasClass {
						storedClass = class
					}
					if c.Media == wire.MediaProtobuf {
						o, _ := wire.ReadProtoObject(b)
						var raw []byte
						if raw, err = service.ProtoServiceForWrite(o.Raw, storedClass, tc.hasClass, "42"); err == nil {
							out, err = wire.RewrapProtoObject(b, raw)
						}
					} else {
						out, err = service.JSONServiceForWrite(b, storedClass, tc.hasClass, "42")
					}
					var ce *service.ClassError
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
					c.Decode(t, out, &got)
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
		if _, err := service.JSONServiceForWrite([]byte(in), class, true, "1"); err == nil {
			t.Errorf("%s accepted", in)
		}
	}
	// A null class and an empty resourceVersion are filled in place.
	out, err := service.JSONServiceForWrite([]byte(`{"metadata":{"resourceVersion":"","name":"a"},"spec":{"type":"LoadBalancer","loadBalancerClass":null}}`), class, true, "9")
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"metadata":{"resourceVersion":"9","name":"a"},"spec":{"type":"LoadBalancer","loadBalancerClass":"hybridccm.io/hcloud"}}`; string(out) != want {
		t.Fatalf("got %s\nwant %s", out, want)
	}
}

// FuzzServiceWire feeds arbitrary bytes to every reader of the Service view:
// errors are fine, panics are not. Where client-go's own decoder reads the
// bytes as a Service, the view must read the same facts from them, and the
// Service it writes without its class must decode to the same Service
// without its class.
func FuzzServiceWire(f *testing.F) {
	for _, c := range servicetest.Codecs(f) {
		s := servicetest.Svc("a", "LoadBalancer", ptr.To("x.io/a"), service.LoadBalancerCleanupFinalizer)
		b := c.Encode(f, s)
		if c.Media == wire.MediaProtobuf {
			o, _ := wire.ReadProtoObject(b)
			f.Add(o.Raw)
		}
		f.Add(b)
		f.Add(c.Encode(f, &corev1.ServiceList{Items: []corev1.Service{*s}}))
		f.Add(c.WatchStream(f, watch.Event{Type: watch.Modified, Object: s}))
	}
	f.Add([]byte(`{"spec":{"loadBalancerClass":"\"}`))
	f.Add([]byte(`{"spec":{"a":1 , "loadBalancerClass":"x" , "b":2},"metadata":{"finalizers":["service.kubernetes.io/load-balancer-cleanup"]}}`))
	f.Add([]byte(`[[[[{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		view, err := serviceview.NewView("x.io/a", true)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = service.JSONServiceForWrite(b, "x.io/a", true, "1")
		_, _ = service.ProtoServiceForWrite(b, "x.io/a", true, "1")
		if o, err := wire.ReadProtoObject(b); err == nil {
			_, _ = wire.RewrapProtoObject(b, o.Raw)
		}
		for _, media := range []wire.Media{wire.MediaJSON, wire.MediaProtobuf} {
			_ = serviceview.FilterList(media, view, bytes.NewReader(b), bufio.NewWriter(io.Discard))
			for _, q := range []url.Values{nil, {"sendInitialEvents": {"true"}}, {"resourceVersion": {"5"}}} {
				_ = serviceview.FilterWatch(media, serviceview.NewWatchState(view, nil, q), bytes.NewReader(b), bufio.NewWriter(io.Discard))
			}
		}
		if svc, err := service.ScanJSON(b); err == nil {
			var want corev1.Service
			if sjson.UnmarshalCaseSensitivePreserveInts(b, &want) == nil {
				checkScanned(t, "JSON", svc, &want, func(out []byte, into *corev1.Service) error {
					return sjson.UnmarshalCaseSensitivePreserveInts(out, into)
				})
			}
		}
		if svc, err := service.ScanProto(b); err == nil {
			var want corev1.Service
			if want.Unmarshal(b) == nil {
				checkScanned(t, "protobuf", svc, &want, func(out []byte, into *corev1.Service) error { return into.Unmarshal(out) })
			}
		}
	})
}

// checkScanned compares what the view read of a Service with what client-go
// decodes: the facts, and the Service written without its class.
func checkScanned(t *testing.T, what string, svc *service.Service, want *corev1.Service, decode func([]byte, *corev1.Service) error) {
	t.Helper()
	f := servicetest.FactsOf(want)
	f.InitialEventsEnd = want.Annotations[metav1.InitialEventsAnnotationKey] == "true"
	if svc.Facts != f {
		t.Fatalf("%s: the view read %+v, the client decodes %+v", what, svc.Facts, f)
	}
	out := svc.AppendWithoutClass(nil)
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
