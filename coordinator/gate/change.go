package gate

import (
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// What a native CCM may change on a node of its own, derived from what the
// unmodified cloud-node-lifecycle controller of k8s.io/cloud-provider (the
// version in go.mod, controllers/nodelifecycle) sends:
//
//   - DELETE of a NotReady node whose instance is gone (empty DeleteOptions);
//   - the taint ShutdownTaint = {key: node.cloudprovider.kubernetes.io/shutdown,
//     effect: NoSchedule}, no value, no timeAdded, added to or removed from
//     spec.taints with node/helpers.AddOrUpdateTaintOnNode and
//     RemoveTaintOffNode: a GET, then a strategic-merge PATCH computed from the
//     node without and with the change, so it carries metadata.resourceVersion
//     (an optimistic-concurrency precondition) and the whole new
//     spec.taints list (taints have no patch merge key), every other taint
//     unchanged and in order. A taint with the same key and effect but
//     another value is replaced by ShutdownTaint;
//   - nothing else: no label, annotation, finalizer, owner reference, no other
//     spec field, never nodes/status (it reads the Ready condition only).
//
// The API server itself changes metadata.resourceVersion and
// metadata.managedFields on every write, and a node's generation never moves,
// so those are not compared. Everything else a CCM could change is denied,
// each with a message naming the field.
const (
	// ShutdownTaintKey is the one taint a native CCM may add or remove.
	ShutdownTaintKey = "node.cloudprovider.kubernetes.io/shutdown"
	// ShutdownTaintEffect is its effect (cloud-provider's ShutdownTaint).
	ShutdownTaintEffect = "NoSchedule"
)

// NodeSpecFields are the fields of core/v1 NodeSpec the fence compares
// (besides taints, which it compares itself). A test checks the list against
// the NodeSpec type, so a Kubernetes upgrade that adds a field fails it until
// the field is handled here.
var NodeSpecFields = []string{"podCIDR", "podCIDRs", "providerID", "unschedulable", "taints", "configSource", "externalID", "podPreemptionPolicy"}

// changeVariables are the fence's CEL variables about what an UPDATE changes.
// Every object read is guarded by the operation (object is null on DELETE),
// and every optional field is read with CEL optionals.
func changeVariables() []admissionregistrationv1.Variable {
	shutdown := "(t.key == " + celString(ShutdownTaintKey) + " && t.effect == " + celString(ShutdownTaintEffect) + ")"
	update := "(request.operation == 'UPDATE')"
	// mapDiff lists the keys whose value differs between two maps.
	mapDiff := func(n, o string) string {
		return n + ".filter(k, !(k in " + o + ") || " + o + "[k] != " + n + "[k]) + " + o + ".filter(k, !(k in " + n + "))"
	}
	// field is a spec field whose change is named.
	field := func(name, zero string) string {
		return "(object.spec.?" + name + ".orValue(" + zero + ") == oldObject.spec.?" + name + ".orValue(" + zero + ") ? [] : ['spec." + name + "'])"
	}
	return []admissionregistrationv1.Variable{
		{Name: "isUpdate", Expression: update},
		{Name: "newLabels", Expression: update + " ? object.metadata.?labels.orValue({}) : {}"},
		{Name: "oldLabels", Expression: update + " ? oldObject.metadata.?labels.orValue({}) : {}"},
		{Name: "changedLabels", Expression: mapDiff("variables.newLabels", "variables.oldLabels")},
		{Name: "newAnnotations", Expression: update + " ? object.metadata.?annotations.orValue({}) : {}"},
		{Name: "oldAnnotations", Expression: update + " ? oldObject.metadata.?annotations.orValue({}) : {}"},
		{Name: "changedAnnotations", Expression: mapDiff("variables.newAnnotations", "variables.oldAnnotations")},
		{Name: "changedMetadata", Expression: "!" + update + " ? [] : " +
			"(object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) ? [] : ['metadata.finalizers']) + " +
			"(object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]) ? [] : ['metadata.ownerReferences'])"},
		// providerID has its own validation; taints are compared below.
		{Name: "changedSpec", Expression: "!" + update + " ? [] : " + strings.Join([]string{
			field("unschedulable", "false"), field("podCIDR", "''"), field("podCIDRs", "[]"),
			field("externalID", "''"),
			"(object.spec.?configSource == oldObject.spec.?configSource ? [] : ['spec.configSource'])",
			// Kubernetes 1.37 (alpha, behind InPlacePodVerticalScalingSchedulerPreemption).
			"(object.spec.?podPreemptionPolicy == oldObject.spec.?podPreemptionPolicy ? [] : ['spec.podPreemptionPolicy'])",
		}, " + ")},
		// Taints other than the shutdown taint, as they are, in order.
		{Name: "newOtherTaints", Expression: update + " ? object.spec.?taints.orValue([]).filter(t, !" + shutdown + ") : []"},
		{Name: "oldOtherTaints", Expression: update + " ? oldObject.spec.?taints.orValue([]).filter(t, !" + shutdown + ") : []"},
		{Name: "changedTaints", Expression: "variables.newOtherTaints == variables.oldOtherTaints ? [] : " +
			"(variables.newOtherTaints.filter(t, !(t in variables.oldOtherTaints)) + variables.oldOtherTaints.filter(t, !(t in variables.newOtherTaints)))" +
			".map(t, t.key + ':' + t.effect)"},
		// The shutdown taint as cloud-provider writes it: no value.
		{Name: "shutdownTaintAsUpstream", Expression: "!" + update + " || object.spec.?taints.orValue([]).all(t, !" + shutdown + " || t.?value.orValue('') == '')"},
	}
}

// changeValidations deny every change of an own node but the shutdown taint.
// guard makes a validation apply to nodes only; who is a CEL expression
// naming the requester.
func changeValidations(guard func(string) string, who string) []admissionregistrationv1.Validation {
	const static = "hybrid-ccm gate: a native CCM may not change "
	allowed := ": on its own nodes a native CCM may only add or remove the taint " + ShutdownTaintKey + ":" + ShutdownTaintEffect + " and delete them"
	deny := func(expr, what, msgExpr string) admissionregistrationv1.Validation {
		return admissionregistrationv1.Validation{
			Expression:        guard(expr),
			Message:           static + what + allowed,
			MessageExpression: msgExpr,
			Reason:            ptr.To(metav1.StatusReasonForbidden),
		}
	}
	prefix := func(what string) string {
		return cel(lit("hybrid-ccm gate: "), who, lit(strings.TrimSuffix(" may not change "+what, " ")+" "))
	}
	named := func(what, list string) string {
		return cel(prefix(what), list+".join(', ')", lit(" of node "), "request.name", lit(allowed))
	}
	return []admissionregistrationv1.Validation{
		deny("!variables.isUpdate || request.?subResource.orValue('') == ''", "the status of a node",
			cel(prefix("the status of node"), "request.name", lit(allowed))),
		deny("size(variables.changedLabels) == 0", "the labels of a node", named("the label(s)", "variables.changedLabels")),
		deny("size(variables.changedAnnotations) == 0", "the annotations of a node", named("the annotation(s)", "variables.changedAnnotations")),
		deny("size(variables.changedMetadata) == 0", "the finalizers or owner references of a node", named("", "variables.changedMetadata")),
		deny("size(variables.changedSpec) == 0", "the spec of a node", named("", "variables.changedSpec")),
		deny("size(variables.changedTaints) == 0", "taints other than the shutdown taint", named("the taint(s)", "variables.changedTaints")),
		deny("variables.shutdownTaintAsUpstream", "the value of the shutdown taint",
			cel(prefix("the value of the taint "+ShutdownTaintKey+" of node"), "request.name", lit(allowed))),
	}
}
