// Package servicetest holds what the tests of the Service view share: the
// client side of each encoding as client-go has it (to encode what the API
// server sends and decode what the CCM gets), and Services of the fixture.
// Only tests import it.
package servicetest

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// codec is the client side of an encoding, as client-go has it.
type Codec struct {
	Name  string
	Media wire.Media
	info  runtime.SerializerInfo
}

func Codecs(t testing.TB) []Codec {
	t.Helper()
	var out []Codec
	for _, m := range []wire.Media{wire.MediaJSON, wire.MediaProtobuf} {
		info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), m.ContentType())
		if !ok {
			t.Fatalf("no serializer for %s", m.ContentType())
		}
		out = append(out, Codec{Name: map[wire.Media]string{wire.MediaJSON: "json", wire.MediaProtobuf: "protobuf"}[m], Media: m, info: info})
	}
	return out
}

func (c Codec) Encode(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := scheme.Codecs.EncoderForVersion(c.info.Serializer, corev1.SchemeGroupVersion)
	if err := enc.Encode(obj, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func (c Codec) Decode(t testing.TB, b []byte, into runtime.Object) {
	t.Helper()
	dec := scheme.Codecs.DecoderToVersion(c.info.Serializer, corev1.SchemeGroupVersion)
	if _, _, err := dec.Decode(b, nil, into); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
}

// scan reads an encoded Service (as the API server answers a get) with the
// object layer, names and versions included.
func (c Codec) Scan(t testing.TB, b []byte) *service.Service {
	t.Helper()
	s, err := ScanService(c.Media, b)
	if err != nil {
		t.Fatalf("scan %q: %v", b, err)
	}
	return s
}

// scanService reads an encoded Service: JSON, or protobuf in its envelope.
func ScanService(media wire.Media, b []byte) (*service.Service, error) {
	return service.ReadOne(media, b, "")
}

// watchStream encodes events as the API server streams them.
func (c Codec) WatchStream(t testing.TB, events ...watch.Event) []byte {
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
func (c Codec) ReadWatch(t testing.TB, b []byte) []watch.Event {
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
func Svc(name, typ string, class *string, finalizers ...string) *corev1.Service {
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
func FactsOf(s *corev1.Service) service.Facts {
	f := service.Facts{
		Namespace: s.Namespace, Name: s.Name, UID: string(s.UID), ResourceVersion: s.ResourceVersion,
		Type: string(s.Spec.Type), Cleanup: slices.Contains(s.Finalizers, service.LoadBalancerCleanupFinalizer),
	}
	if s.Spec.LoadBalancerClass != nil {
		f.Class, f.HasClass = *s.Spec.LoadBalancerClass, true
	}
	return f
}
