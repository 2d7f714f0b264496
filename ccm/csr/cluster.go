package csr

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// The API server's own Service and the EndpointSlices of it that the API
// server keeps (default/kubernetes).
const (
	apiServerNamespace = metav1.NamespaceDefault
	apiServerService   = "kubernetes"
)

// clusterAddresses knows what belongs to the cluster itself and so is never
// a node's to have in a serving certificate, whatever the node says: the
// Service CIDRs (ServiceCIDR objects), the kubernetes Service's IPs, the API
// server's endpoints (EndpointSlices of default/kubernetes) and the host of
// the server talos-ccm reaches the cluster at. It reads them through
// informers of its own, scoped to those objects (RBAC: servicecidrs
// list/watch; in namespace default, services and endpointslices named
// kubernetes list/watch).
type clusterAddresses struct {
	cidrs, svc, slice cache.SharedIndexInformer
	serverIP          netip.Addr
	serverName        string
}

// newClusterAddresses watches the cluster's own addresses; server is the
// URL (or host) talos-ccm reaches the API server at ("" when unknown).
func newClusterAddresses(client kubernetes.Interface, server string) *clusterAddresses {
	a := &clusterAddresses{
		cidrs: networkinginformers.NewServiceCIDRInformer(client, 0, cache.Indexers{}),
		svc: coreinformers.NewFilteredServiceInformer(client, apiServerNamespace, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", apiServerService).String()
		}),
		// the API server keeps its endpoints in the EndpointSlice of the
		// Service's name (what RBAC can grant by name)
		slice: discoveryinformers.NewFilteredEndpointSliceInformer(client, apiServerNamespace, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", apiServerService).String()
		}),
	}
	host := server
	if u, err := url.Parse(server); err == nil && u.Host != "" {
		host = u.Host
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if ip, err := netip.ParseAddr(host); err == nil {
		a.serverIP = ip.Unmap().WithZone("")
	} else if host != "" {
		a.serverName = strings.ToLower(strings.TrimSuffix(host, "."))
	}
	return a
}

// run reads until ctx ends.
func (a *clusterAddresses) run(ctx context.Context) {
	for _, inf := range []cache.SharedIndexInformer{a.cidrs, a.svc, a.slice} {
		go inf.Run(ctx.Done())
	}
}

// synced reports whether every informer has its first list.
func (a *clusterAddresses) synced() bool {
	return a.cidrs.HasSynced() && a.svc.HasSynced() && a.slice.HasSynced()
}

// ip returns what of the cluster ip is, or "", and whether it is an
// endpoint of the API server (a control-plane node's own address).
func (a *clusterAddresses) ip(ip netip.Addr) (string, bool) {
	if ip == a.serverIP {
		return "the host of the API server talos-ccm reaches the cluster at", true
	}
	for _, o := range a.cidrs.GetStore().List() {
		sc, ok := o.(*networkingv1.ServiceCIDR)
		if !ok {
			continue
		}
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil && p.Contains(ip) {
				return fmt.Sprintf("in ServiceCIDR %s (%s)", sc.Name, p), false
			}
		}
	}
	for _, o := range a.svc.GetStore().List() {
		svc, ok := o.(*corev1.Service)
		if !ok || svc.Name != apiServerService {
			continue
		}
		for _, c := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
			if p, err := netip.ParseAddr(c); err == nil && p.Unmap() == ip {
				return "the IP of Service default/kubernetes", false
			}
		}
	}
	for _, o := range a.slice.GetStore().List() {
		es, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		for _, ep := range es.Endpoints {
			for _, addr := range ep.Addresses {
				if p, err := netip.ParseAddr(addr); err == nil && p.Unmap() == ip {
					return fmt.Sprintf("an endpoint of the API server (EndpointSlice %s/%s)", es.Namespace, es.Name), true
				}
			}
		}
	}
	return "", false
}

// name returns what of the cluster the DNS name n is, or "".
func (a *clusterAddresses) name(n string) string {
	if a.serverName != "" && strings.ToLower(strings.TrimSuffix(n, ".")) == a.serverName {
		return "the host of the API server talos-ccm reaches the cluster at"
	}
	return ""
}
