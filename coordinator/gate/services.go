package gate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// What a native CCM may change on Services, derived from what the unmodified
// service controller of k8s.io/cloud-provider (controllers/service, the version
// in go.mod) sends: every write is servicehelper.PatchService, a
// strategic-merge PATCH of services/status computed from the Service before
// and after with the spec reset, carrying status.loadBalancer and the
// finalizer service.kubernetes.io/load-balancer-cleanup (added before a load
// balancer is made, removed after it is deleted). It never creates, updates
// or deletes a Service.
//
// So on a Service of its own (type LoadBalancer, its class, or no class when
// it is the default) it may change the status and add or remove that
// finalizer through services/status; nothing else on any Service.
const (
	// LoadBalancerCleanupFinalizer is the service controller's finalizer.
	LoadBalancerCleanupFinalizer = "service.kubernetes.io/load-balancer-cleanup"
)

// What a native CCM may announce as a load balancer's ingress IP
// (status.loadBalancer.ingress[].ip): kube-proxy routes traffic for it into
// the Service (the load-balancer half of CVE-2020-8554), so never an address
// of the cluster or of its nodes' own networks. The fence has no parameters
// (grant.go says why): the cluster's CIDRs and the ranges a NativeCCM's
// cloud allocates from are data in the policy itself, rendered by the chart
// (values clusterNetwork and loadBalancerIngressCIDRs) or given by
// Fence.Ingress.

// Placeholders of the ingress data in FenceDigest and FenceTemplate.
const (
	digestReservedIngress = "@RESERVED_INGRESS_CIDRS@"
	digestIngressRanges   = "@INGRESS_RANGES@"
)

// DefaultReservedIngressCIDRs are Talos's default Service and pod CIDRs.
var DefaultReservedIngressCIDRs = []string{"10.96.0.0/12", "10.244.0.0/16"}

// Ingress is what the fence knows about load-balancer ingress IPs.
type Ingress struct {
	// Reserved are never an ingress IP: the cluster's Service, pod and node
	// CIDRs.
	// Nil: DefaultReservedIngressCIDRs.
	Reserved []string
	// Ranges maps a NativeCCM to the CIDRs its cloud allocates load-balancer
	// IPs from: its ingress IPs must be in one of them. A NativeCCM without
	// an entry may announce any other global unicast address.
	Ranges map[string][]string
}

// literals returns the two tables as the policy holds them (JSON, which is
// CEL), checking every CIDR.
func (in Ingress) literals() (reserved, ranges string, err error) {
	res := in.Reserved
	if res == nil {
		res = DefaultReservedIngressCIDRs
	}
	var errs []error
	check := func(where string, cidrs []string) []string {
		out := make([]string, 0, len(cidrs))
		for _, c := range cidrs {
			if p, err := netip.ParsePrefix(c); err != nil || p != p.Masked() {
				errs = append(errs, fmt.Errorf("%s: %q is not a CIDR (address with host bits cleared / prefix length)", where, c))
				continue
			}
			out = append(out, c)
		}
		return sortedUnique(out)
	}
	norm := map[string][]string{}
	for name, cidrs := range in.Ranges {
		norm[name] = check("loadBalancerIngressCIDRs."+name, cidrs)
	}
	rb, _ := json.Marshal(check("clusterNetwork", res))
	mb, _ := json.Marshal(norm)
	if len(errs) > 0 {
		return "", "", fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return string(rb), string(mb), nil
}

// fillIngress puts the ingress tables into a rendered fence policy.
func fillIngress(p *admissionregistrationv1.ValidatingAdmissionPolicy, in Ingress) error {
	reserved, ranges, err := in.literals()
	if err != nil {
		return err
	}
	for i, v := range p.Spec.Variables {
		switch v.Expression {
		case digestReservedIngress:
			p.Spec.Variables[i].Expression = reserved
		case digestIngressRanges:
			p.Spec.Variables[i].Expression = ranges
		}
	}
	return nil
}

// copyIngress puts the ingress tables of an installed fence (data, as the
// prefix table) into want, once they prove to be tables of CIDRs.
func copyIngress(want, installed *admissionregistrationv1.ValidatingAdmissionPolicy) error {
	got := map[string]string{}
	for _, v := range installed.Spec.Variables {
		got[v.Name] = v.Expression
	}
	var in Ingress
	if err := json.Unmarshal([]byte(got["reservedIngressCIDRs"]), &in.Reserved); err != nil {
		return fmt.Errorf("the reserved ingress CIDRs are not a list (%w)", err)
	}
	if err := json.Unmarshal([]byte(got["ingressRanges"]), &in.Ranges); err != nil {
		return fmt.Errorf("the ingress ranges are not a table (%w)", err)
	}
	if _, _, err := in.literals(); err != nil {
		return err
	}
	for i, v := range want.Spec.Variables {
		switch v.Expression {
		case digestReservedIngress:
			want.Spec.Variables[i].Expression = got["reservedIngressCIDRs"]
		case digestIngressRanges:
			want.Spec.Variables[i].Expression = got["ingressRanges"]
		}
	}
	return nil
}

// ingressTemplate replaces the ingress placeholders of the fence's YAML with
// the chart's values, as FenceTemplate does the prefix table.
func ingressTemplate(spec []byte) ([]byte, error) {
	for _, r := range []struct{ placeholder, template string }{
		{digestReservedIngress, "{{ concat (.Values.clusterNetwork.serviceCIDRs | default list) (.Values.clusterNetwork.podCIDRs | default list) (.Values.clusterNetwork.nodeCIDRs | default list) | uniq | sortAlpha | toJson | toJson }}"},
		{digestIngressRanges, "{{ .Values.loadBalancerIngressCIDRs | default dict | toJson | toJson }}"},
	} {
		quoted := []byte("expression: '" + r.placeholder + "'")
		if !bytes.Contains(spec, quoted) {
			return nil, fmt.Errorf("gate.FenceTemplate: the placeholder %s is not a plain expression", r.placeholder)
		}
		spec = bytes.ReplaceAll(spec, quoted, []byte("expression: "+r.template))
	}
	return spec, nil
}

// ingressVariables are the fence's CEL variables about the ingress IPs a
// write of services/status adds (those already there stay, whatever the
// tables say now).
func ingressVariables() []admissionregistrationv1.Variable {
	ips := func(obj string) string {
		return obj + ".status.?loadBalancer.?ingress.orValue([]).filter(i, has(i.ip)).map(i, i.ip)"
	}
	return []admissionregistrationv1.Variable{
		{Name: "reservedIngressCIDRs", Expression: digestReservedIngress},
		{Name: "ingressRanges", Expression: digestIngressRanges},
		{Name: "addedIngressIPs", Expression: "variables.isService && request.operation == 'UPDATE' ? " +
			ips("object") + ".filter(x, !(x in " + ips("oldObject") + ")) : []"},
		// CEL's ip library: isGlobalUnicast is false for loopback,
		// link-local (169.254.169.254 too), unspecified, multicast and
		// broadcast addresses; an IPv4-mapped IPv6 address is no IP to it.
		{Name: "refusedIngressIPs", Expression: "variables.addedIngressIPs.filter(x, !isIP(x) || !ip(x).isGlobalUnicast() || " +
			"variables.reservedIngressCIDRs.exists(c, cidr(c).containsIP(ip(x))) || " +
			"(variables.nativeCCM in variables.ingressRanges && !variables.ingressRanges[variables.nativeCCM].exists(c, cidr(c).containsIP(ip(x)))))"},
	}
}

// ingressValidation refuses a load balancer ingress IP of the cluster, of a
// node's own networks or outside the NativeCCM's ranges.
func ingressValidation(who string) admissionregistrationv1.Validation {
	svc := "(request.namespace + '/' + request.name)"
	return admissionregistrationv1.Validation{
		Expression: "size(variables.refusedIngressIPs) == 0",
		Message:    "hybrid-ccm gate: a native CCM may not announce a load balancer ingress IP of the cluster, of a node's own networks or outside its cloud's ranges",
		MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not announce "), "variables.refusedIngressIPs.join(', ')",
			lit(" as load balancer ingress of Service "), svc,
			lit(": loopback, link-local (169.254.169.254), unspecified, multicast and broadcast addresses, the cluster's Service and pod CIDRs "),
			"variables.reservedIngressCIDRs.join(', ')",
			"(variables.nativeCCM in variables.ingressRanges ? ' and addresses outside ' + variables.ingressRanges[variables.nativeCCM].join(', ') : '')",
			lit(" are refused (CVE-2020-8554)")),
		Reason: ptr.To(metav1.StatusReasonForbidden),
	}
}

// serviceVariables are the fence's CEL variables about Services. Every object
// read is guarded by the operation and optional. What the native CCM serves
// comes from its grant (RBAC, asked with the authorizer): load balancers at
// all, a class, and the Services without a class.
func serviceVariables() []admissionregistrationv1.Variable {
	update := "(request.operation == 'UPDATE')"
	return append([]admissionregistrationv1.Variable{
		{Name: "svcClass", Expression: "request.operation == 'CREATE' ? '' : oldObject.spec.?loadBalancerClass.orValue('')"},
		{Name: "svcLB", Expression: "request.operation != 'CREATE' && oldObject.spec.?type.orValue('') == 'LoadBalancer'"},
		{Name: "servesLoadBalancers", Expression: grantCheck(grantLoadBalancers, "")},
		{Name: "servesClass", Expression: "variables.svcClass != '' && " + grantCheck(grantClasses, "variables.svcClass")},
		{Name: "servesDefault", Expression: grantCheck(grantDefault, "")},
		// A Service that stopped being a LoadBalancer lost its class (the API
		// server clears it) but keeps the cleanup finalizer until its load
		// balancer is gone: every CCM serving load balancers sees it (ccm-gate)
		// and may clear it, since nothing says whose it was.
		{Name: "ownService", Expression: "variables.servesLoadBalancers && (variables.svcLB ? (variables.svcClass == '' ? variables.servesDefault : variables.servesClass) : " +
			"(variables.svcClass == '' && request.operation != 'CREATE' && oldObject.metadata.?finalizers.orValue([]).exists(f, f == " + celString(LoadBalancerCleanupFinalizer) + ")))"},
		{Name: "changedFinalizers", Expression: "!" + update + " ? [] : " +
			"object.metadata.?finalizers.orValue([]).filter(f, !(f in oldObject.metadata.?finalizers.orValue([]))) + " +
			"oldObject.metadata.?finalizers.orValue([]).filter(f, !(f in object.metadata.?finalizers.orValue([])))"},
	}, ingressVariables()...)
}

// serviceValidations deny every Service write of a native CCM but the status
// and the cleanup finalizer of its own Services, through services/status.
func serviceValidations(who string) []admissionregistrationv1.Validation {
	guard := func(expr string) string { return "!variables.isService || (" + expr + ")" }
	svc := "(request.namespace + '/' + request.name)"
	deny := func(expr, static string, msg ...string) admissionregistrationv1.Validation {
		return admissionregistrationv1.Validation{
			Expression:        guard(expr),
			Message:           "hybrid-ccm gate: a native CCM " + static,
			MessageExpression: cel(append([]string{lit("hybrid-ccm gate: "), who}, msg...)...),
			Reason:            ptr.To(metav1.StatusReasonForbidden),
		}
	}
	// Message expressions get no authorizer (the API server evaluates them
	// without one): they may not read what the grant says, only the request.
	grant := lit(GrantPrefix) + " + variables.nativeCCM"
	return []admissionregistrationv1.Validation{
		deny("request.operation == 'UPDATE'", "may not create or delete Services",
			lit(" may not "), "(request.operation == 'CREATE' ? 'create' : 'delete')", lit(" Service "), svc),
		deny("request.?subResource.orValue('') == 'status'", "may change Services only through services/status",
			lit(" may not change Service "), svc, lit(": a native CCM changes Services only through services/status, as the service controller does")),
		deny("variables.servesLoadBalancers", "may change no Service unless it serves load balancers",
			lit(" may not change Service "), svc, lit(": it serves no load balancers (its grant "), grant, lit(" names none: spec.loadBalancers is off)")),
		deny("variables.ownService", "may only change Services of type LoadBalancer of its own class",
			lit(" may not change Service "), svc, lit(": "),
			"(!variables.svcLB ? 'it is not of type LoadBalancer' : (variables.svcClass == '' ? "+
				"'it has no load balancer class, and its grant ' + "+grant+" + ' does not make it the default for Services without a class' : "+
				"'its load balancer class is ' + variables.svcClass + ', which its grant ' + "+grant+" + ' does not name'))"),
		deny("size(variables.changedLabels) == 0 && size(variables.changedAnnotations) == 0 && "+
			"(request.operation != 'UPDATE' || object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([])) && "+
			"variables.changedFinalizers.all(f, f == "+celString(LoadBalancerCleanupFinalizer)+")",
			"may only change the status and the finalizer "+LoadBalancerCleanupFinalizer+" of a Service",
			lit(" may not change the labels, annotations, owners or finalizers of Service "), svc,
			lit(": on its own Services a native CCM may only change the status and add or remove the finalizer "+LoadBalancerCleanupFinalizer)),
		ingressValidation(who),
	}
}
