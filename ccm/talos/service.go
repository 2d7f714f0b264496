package talos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"google.golang.org/grpc/resolver"
)

// The Service Talos keeps for its API in every cluster with Kubernetes Talos
// API access (machine.features.kubernetesTalosAPIAccess): default/talos, no
// selector, and EndpointSlices of fixed names whose endpoints are the
// control planes' apid addresses. The talosconfig Talos writes for a
// talos.dev ServiceAccount names it as its only endpoint ("talos.default"),
// and apid's certificate carries that name.
const (
	ServiceName      = "talos"
	ServiceNamespace = "default"
)

// ServiceEndpointSlices are the names Talos gives the Service's
// EndpointSlices, one per address family. talos-ccm's RBAC names exactly
// these.
var ServiceEndpointSlices = []string{ServiceName + "-ipv4", ServiceName + "-ipv6"}

// IsServiceHost reports whether host (no port) names the Talos Service:
// talos.default, talos.default.svc or talos.default.svc.<cluster domain>.
func IsServiceHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	base := ServiceName + "." + ServiceNamespace
	return host == base || host == base+".svc" || strings.HasPrefix(host, base+".svc.")
}

// serviceResolver answers the gRPC "dns" scheme for the Talos Service's
// names from its EndpointSlices, read through the API server, and passes
// every other name to gRPC's DNS resolver. talos-ccm runs on the host network
// and initializes the nodes of a fresh cluster: cluster DNS may not answer
// yet (CoreDNS is a pod: it needs a node with a pod network,
// whose pod CIDR talos-ccm's node IPAM may be the one to give), the API
// server always does. The connection keeps the name as its authority, so TLS
// still checks apid's certificate for talos.default.
type serviceResolver struct {
	kube kubernetes.Interface
	dns  resolver.Builder
}

// newServiceResolver resolves the Talos Service's names through kube.
func newServiceResolver(kube kubernetes.Interface) resolver.Builder {
	return &serviceResolver{kube: kube, dns: resolver.Get("dns")}
}

func (b *serviceResolver) Scheme() string { return "dns" }

func (b *serviceResolver) Build(target resolver.Target, cc resolver.ClientConn, opts resolver.BuildOptions) (resolver.Resolver, error) {
	host, port, err := net.SplitHostPort(target.Endpoint())
	if err != nil || !IsServiceHost(host) {
		if b.dns == nil {
			return nil, fmt.Errorf("talos: no DNS resolver for %q", target.Endpoint())
		}
		return b.dns.Build(target, cc, opts)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("talos: endpoint %q: port: %w", target.Endpoint(), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &serviceEndpoints{cc: cc, port: uint16(p), cancel: cancel, slices: map[string]*discoveryv1.EndpointSlice{}}
	var synced []cache.InformerSynced
	for _, name := range ServiceEndpointSlices {
		lw := cache.NewFilteredListWatchFromClient(b.kube.DiscoveryV1().RESTClient(), "endpointslices", ServiceNamespace,
			func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
			})
		inf := cache.NewSharedIndexInformer(lw, &discoveryv1.EndpointSlice{}, 0, cache.Indexers{})
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.set(name, obj) },
			UpdateFunc: func(_, obj any) { r.set(name, obj) },
			DeleteFunc: func(any) { r.set(name, nil) },
		}); err != nil {
			cancel()
			return nil, err
		}
		go inf.RunWithContext(ctx)
		synced = append(synced, inf.HasSynced)
	}
	go func() {
		// Until both slices were listed, no answer (not even "none"): the
		// connection waits for the first.
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return
		}
		r.mu.Lock()
		r.synced = true
		r.updateLocked()
		r.mu.Unlock()
	}()
	klog.InfoS("Resolving the Talos API endpoint through the API server", "endpoint", target.Endpoint(),
		"service", ServiceNamespace+"/"+ServiceName, "endpointSlices", ServiceEndpointSlices)
	return r, nil
}

// serviceEndpoints is one resolution of the Talos Service: the ready
// endpoints of its EndpointSlices.
type serviceEndpoints struct {
	cc     resolver.ClientConn
	port   uint16
	cancel context.CancelFunc

	mu     sync.Mutex
	synced bool
	slices map[string]*discoveryv1.EndpointSlice
	// last is what the connection was last told (nil: nothing yet).
	last []string
}

func (r *serviceEndpoints) set(name string, obj any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if es, ok := obj.(*discoveryv1.EndpointSlice); ok {
		r.slices[name] = es
	} else {
		delete(r.slices, name)
	}
	if r.synced {
		r.updateLocked()
	}
}

// updateLocked tells the connection the current addresses, or that there
// are none.
func (r *serviceEndpoints) updateLocked() {
	addrs := ServiceAddresses(r.port, r.sliceList()...)
	if addrs == nil {
		addrs = []string{}
	}
	if r.last != nil && slices.Equal(addrs, r.last) {
		return
	}
	r.last = addrs
	if len(addrs) == 0 {
		klog.InfoS("The Talos Service has no ready endpoint", "service", ServiceNamespace+"/"+ServiceName, "endpointSlices", ServiceEndpointSlices)
		r.cc.ReportError(fmt.Errorf("%w: Service %s/%s has no ready endpoint in EndpointSlices %s (Talos writes them from the control planes)",
			ErrNoServiceEndpoints, ServiceNamespace, ServiceName, strings.Join(ServiceEndpointSlices, ", ")))
		return
	}
	state := resolver.State{}
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	klog.InfoS("Talos API endpoints", "service", ServiceNamespace+"/"+ServiceName, "addresses", addrs)
	_ = r.cc.UpdateState(state)
}

func (r *serviceEndpoints) sliceList() []*discoveryv1.EndpointSlice {
	out := make([]*discoveryv1.EndpointSlice, 0, len(r.slices))
	for _, s := range r.slices {
		out = append(out, s)
	}
	return out
}

// ResolveNow: the informers keep the addresses current.
func (r *serviceEndpoints) ResolveNow(resolver.ResolveNowOptions) {}

func (r *serviceEndpoints) Close() { r.cancel() }

// ErrNoServiceEndpoints: the Talos Service has no ready endpoint.
var ErrNoServiceEndpoints = errors.New("no Talos API endpoint")

// ServiceAddresses are the host:port addresses of the ready endpoints of
// the Talos Service's EndpointSlices, sorted: the port named "apid" (else the
// slice's only port, else port), every endpoint not marked not ready, each
// address of the slice's own family (an IPv4-mapped one in the IPv6 slice is not).
func ServiceAddresses(port uint16, from ...*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, es := range from {
		if es == nil {
			continue
		}
		p := port
		for _, sp := range es.Ports {
			if sp.Port != nil && (len(es.Ports) == 1 || (sp.Name != nil && *sp.Name == "apid")) {
				p = uint16(*sp.Port)
			}
		}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || ip.Is4In6() || (es.AddressType == discoveryv1.AddressTypeIPv4) != ip.Is4() {
					continue // not an address of the slice's family
				}
				out = append(out, netip.AddrPortFrom(ip, p).String())
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
