package gate

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// DNSPort is the port the native CCMs' NetworkPolicy lets them reach, UDP
// and TCP, at any address: the cluster's DNS (the pod's resolv.conf) and
// any other resolver it names.
const DNSPort = 53

// Egress is a set of destinations a native CCM may reach: addresses (CIDRs)
// and TCP ports.
type Egress struct {
	CIDRs []string `json:"cidrs"`
	Ports []int32  `json:"ports"`
}

// Validate checks that e names at least one CIDR and one port, each valid.
// what names the setting in errors (e.g. "--native-ccm-api-server-cidrs").
func (e Egress) Validate(what string) error {
	if len(e.CIDRs) == 0 || len(e.Ports) == 0 {
		return fmt.Errorf("%w: %s: at least one CIDR and one port", ErrConfig, what)
	}
	for _, c := range e.CIDRs {
		if !ValidCIDR(c) {
			return fmt.Errorf("%w: %s: %q is not a CIDR (address/bits, host bits zero)", ErrConfig, what, c)
		}
	}
	for _, p := range e.Ports {
		if !ValidPort(p) {
			return fmt.Errorf("%w: %s: port %d is not 1-65535", ErrConfig, what, p)
		}
	}
	return nil
}

// ValidCIDR reports whether c is a destination an Egress may name: an
// address/bits prefix with the host bits zero (what a NetworkPolicy's ipBlock
// takes).
func ValidCIDR(c string) bool {
	p, err := netip.ParsePrefix(c)
	return err == nil && p.Masked() == p
}

// ValidPort reports whether p is a TCP port an Egress may name (1-65535).
func ValidPort(p int32) bool { return p >= 1 && p <= 65535 }

// NetworkPolicyConfig is what the coordinator's native CCM NetworkPolicies
// let out (--native-ccm-network-policy and the flags after it): the API
// server's addresses and ports, those of the cloud APIs. The same for every
// native CCM.
type NetworkPolicyConfig struct {
	APIServer Egress `json:"apiServer"`
	CloudAPI  Egress `json:"cloudAPI"`
}

// Validate checks both destinations.
func (c NetworkPolicyConfig) Validate() error {
	if err := c.APIServer.Validate("API server"); err != nil {
		return err
	}
	return c.CloudAPI.Validate("cloud API")
}

// NetworkPolicy is the release mutator that confines a native CCM's pods'
// network (opt-in): nothing in (the gate's API proxy and metrics listen on
// loopback, reachable only inside the pod; the kubelet's probes of the gate's
// health port and the CCM's secure port come from the node, which network
// policies do not filter), and out only DNS, the API server (the gate's
// connection) and the cloud APIs. Any NetworkPolicy the chart renders is
// dropped: this is the release's only one. It has no effect on pods in the
// host network.
type NetworkPolicy struct {
	// Release is the release name: the NetworkPolicy's name, and the value of
	// the pod label hybridccm.io/native-ccm it selects.
	Release   string `json:"release"`
	Namespace string `json:"namespace"`
	Platform  string `json:"platform"`
	NetworkPolicyConfig
}

var _ release.Mutator = NetworkPolicy{}

// Name implements release.Mutator.
func (n NetworkPolicy) Name() string { return "network-policy" }

// Fingerprint implements release.Mutator.
func (n NetworkPolicy) Fingerprint() string {
	b, _ := json.Marshal(struct {
		V int
		N NetworkPolicy
	}{V: 1, N: n})
	return fmt.Sprintf("%x", sha256.Sum256(b))[:16]
}

// Mutate implements release.Mutator.
func (n NetworkPolicy) Mutate(m *release.Manifests) error {
	if n.Release == "" || n.Namespace == "" {
		return fmt.Errorf("%w: network policy: release and namespace are required", ErrConfig)
	}
	if err := n.Validate(); err != nil {
		return fmt.Errorf("network policy of %s: %w", n.Release, err)
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(n.Object())
	if err != nil {
		return err
	}
	unstructured.RemoveNestedField(obj, "metadata", "creationTimestamp")
	m.Remove(func(o *unstructured.Unstructured) bool { return o.GetKind() == "NetworkPolicy" })
	m.Add(&unstructured.Unstructured{Object: obj})
	return nil
}

// Object is the release's NetworkPolicy.
func (n NetworkPolicy) Object() *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	ports := func(ps []int32) []networkingv1.NetworkPolicyPort {
		out := make([]networkingv1.NetworkPolicyPort, len(ps))
		for i, p := range ps {
			out[i] = networkingv1.NetworkPolicyPort{Protocol: ptr.To(tcp), Port: ptr.To(intstr.FromInt32(p))}
		}
		return out
	}
	to := func(cidrs []string) []networkingv1.NetworkPolicyPeer {
		out := make([]networkingv1.NetworkPolicyPeer, len(cidrs))
		for i, c := range cidrs {
			out[i] = networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: c}}
		}
		return out
	}
	dns := intstr.FromInt32(DNSPort)
	return &networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Release, Namespace: n.Namespace,
			Labels: map[string]string{
				release.ManagedByLabel: release.ManagedByValue,
				release.NativeCCMLabel: n.Release,
				release.PlatformLabel:  n.Platform,
			},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{release.NativeCCMLabel: n.Release}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			// no ingress rule: nothing in
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(udp), Port: &dns}, {Protocol: ptr.To(tcp), Port: &dns}}},
				{Ports: ports(n.APIServer.Ports), To: to(n.APIServer.CIDRs)},
				{Ports: ports(n.CloudAPI.Ports), To: to(n.CloudAPI.CIDRs)},
			},
		},
	}
}
