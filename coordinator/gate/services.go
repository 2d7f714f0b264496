package gate

import (
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

// serviceVariables are the fence's CEL variables about Services. Every object
// read is guarded by the operation and optional. What the native CCM serves
// comes from its grant (RBAC, asked with the authorizer): load balancers at
// all, a class, and the Services without a class.
func serviceVariables() []admissionregistrationv1.Variable {
	update := "(request.operation == 'UPDATE')"
	return []admissionregistrationv1.Variable{
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
	}
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
	}
}
