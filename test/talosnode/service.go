package talosnode

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
)

// ApidPort is where apid listens on every Talos machine.
const ApidPort = 50000

// KeepService does what Talos does in a cluster with Kubernetes Talos API
// access: the Service default/talos (no selector, port apid 50000) and its
// EndpointSlices talos-ipv4 and talos-ipv6 listing the control planes' apid
// addresses, created or brought up to date: talos-ipv4 always (empty without
// an IPv4 apid), talos-ipv6 when an IPv6 apid is listed (deleted otherwise). A slice names one port, so the addresses of one family must
// share theirs (on Talos every apid listens on 50000; a test's apids on
// other ports list one address per family).
func KeepService(ctx context.Context, kube kubernetes.Interface, apids ...netip.AddrPort) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: talos.ServiceName, Namespace: talos.ServiceNamespace,
			Labels: map[string]string{"provider": "talos", "component": "apid"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "apid", Port: ApidPort, Protocol: corev1.ProtocolTCP,
			TargetPort: intstr.FromInt32(ApidPort)}}},
	}
	if _, err := kube.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("talosnode: Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	for i, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		var endpoints []discoveryv1.Endpoint
		var port int32
		for _, a := range apids {
			if a.Addr().Unmap().Is4() != (family == discoveryv1.AddressTypeIPv4) {
				continue
			}
			if port != 0 && int32(a.Port()) != port {
				return fmt.Errorf("talosnode: the %s apids listen on ports %d and %d: one EndpointSlice names one port", family, port, a.Port())
			}
			port = int32(a.Port())
			endpoints = append(endpoints, discoveryv1.Endpoint{Addresses: []string{a.Addr().Unmap().String()}})
		}
		if port == 0 {
			port = ApidPort
		}
		name, proto := "apid", corev1.ProtocolTCP
		es := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: talos.ServiceEndpointSlices[i], Namespace: talos.ServiceNamespace,
				Labels: map[string]string{"kubernetes.io/service-name": talos.ServiceName, "provider": "talos", "component": "apid"}},
			AddressType: family,
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
			Endpoints:   endpoints,
		}
		esc := kube.DiscoveryV1().EndpointSlices(es.Namespace)
		cur, err := esc.Get(ctx, es.Name, metav1.GetOptions{})
		switch {
		case len(endpoints) == 0 && family == discoveryv1.AddressTypeIPv6:
			if err == nil {
				err = esc.Delete(ctx, es.Name, metav1.DeleteOptions{})
			}
			if apierrors.IsNotFound(err) {
				err = nil
			}
		case apierrors.IsNotFound(err):
			_, err = esc.Create(ctx, es, metav1.CreateOptions{})
		case err == nil:
			es.ResourceVersion = cur.ResourceVersion
			_, err = esc.Update(ctx, es, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("talosnode: EndpointSlice %s/%s: %w", es.Namespace, es.Name, err)
		}
	}
	return nil
}
