package serviceview

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
)

// benchList is 5000 Services as the API server lists them for the service
// controller: managed fields, labels, a selector, a port, a finalizer and an
// address each.
func benchList() *corev1.ServiceList {
	l := &corev1.ServiceList{TypeMeta: metav1.TypeMeta{Kind: "ServiceList", APIVersion: "v1"}, ListMeta: metav1.ListMeta{ResourceVersion: "12345"}}
	now := metav1.NewTime(time.Date(2026, 11, 24, 1, 2, 3, 0, time.UTC))
	fields := []byte(`{"f:metadata":{"f:finalizers":{".":{},"v:\"service.kubernetes.io/load-balancer-cleanup\"":{}},"f:labels":{".":{},"f:app":{},"f:tier":{}}},"f:spec":{"f:allocateLoadBalancerNodePorts":{},"f:externalTrafficPolicy":{},"f:internalTrafficPolicy":{},"f:loadBalancerClass":{},"f:ports":{".":{},"k:{\"port\":443,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{},"f:sessionAffinity":{},"f:type":{}}}`)
	for i := range 5000 {
		s := svc(fmt.Sprintf("svc-%05d", i), "LoadBalancer", ptr.To("hybridccm.io/hcloud"), service.LoadBalancerCleanupFinalizer)
		s.TypeMeta = metav1.TypeMeta{}
		s.UID = "0b5c9812-ebf4-4303-905d-40b1e3c9bc27"
		s.CreationTimestamp = now
		s.ManagedFields = []metav1.ManagedFieldsEntry{
			{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: fields}},
			{Manager: "cloud-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:loadBalancer":{"f:ingress":{}}}}`)}, Subresource: "status"},
		}
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.3.4", []string{"10.96.3.4"}
		s.Spec.Selector = map[string]string{"app": s.Name}
		l.Items = append(l.Items, *s)
	}
	return l
}

// BenchmarkFilterServiceList is the gate's own work on a list of 5000
// Services, all in the view (every one copied without its class).
func BenchmarkFilterServiceList(b *testing.B) {
	l := benchList()
	for _, c := range codecs(b) {
		b.Run(c.Name, func(b *testing.B) {
			in := c.Encode(b, l)
			filter := listFilter(c, testProxy(b, "hybridccm.io/hcloud", false))
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				w := bufio.NewWriterSize(io.Discard, 32<<10)
				if err := filter(bytes.NewReader(in), w); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFilterServiceWatch is the gate's own work on a WatchList's 5000
// initial events.
func BenchmarkFilterServiceWatch(b *testing.B) {
	l := benchList()
	events := make([]watch.Event, 0, len(l.Items))
	for i := range l.Items {
		s := l.Items[i]
		s.TypeMeta = metav1.TypeMeta{Kind: "Service", APIVersion: "v1"}
		events = append(events, watch.Event{Type: watch.Added, Object: &s})
	}
	for _, c := range codecs(b) {
		b.Run(c.Name, func(b *testing.B) {
			in := c.WatchStream(b, events...)
			p := testProxy(b, "hybridccm.io/hcloud", false)
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				filter := watchFilter(c, p.watchState(map[string][]string{"sendInitialEvents": {"true"}}))
				w := bufio.NewWriterSize(io.Discard, 32<<10)
				if err := filter(bytes.NewReader(in), w); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
