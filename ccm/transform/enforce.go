package transform

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// OwnedKeysAnnotation records, on each node, the keys enforce mode manages
// there: the labels, annotations and taints rules produced at the last
// reconciliation. Its value is OwnedKeys.Encode.
const OwnedKeysAnnotation = "node.cloudprovider.kubernetes.io/transformations-owned"

// OwnedKeys are the keys rule output occupies on a node.
type OwnedKeys struct {
	Labels      []string `json:"labels,omitempty"`
	Annotations []string `json:"annotations,omitempty"`
	// Taints are TaintID strings, "key:Effect".
	Taints []string `json:"taints,omitempty"`
}

// TaintID identifies a taint on a node: its key and effect ("key:Effect").
func TaintID(t corev1.Taint) string { return t.Key + ":" + string(t.Effect) }

// Empty reports whether o lists no key.
func (o OwnedKeys) Empty() bool {
	return len(o.Labels) == 0 && len(o.Annotations) == 0 && len(o.Taints) == 0
}

func (o OwnedKeys) clone() OwnedKeys {
	return OwnedKeys{Labels: slices.Clone(o.Labels), Annotations: slices.Clone(o.Annotations), Taints: slices.Clone(o.Taints)}
}

func canonical(keys []string) []string {
	keys = slices.Clone(keys)
	sort.Strings(keys)
	return slices.Compact(keys)
}

// Encode returns the canonical annotation value: compact JSON with sorted,
// de-duplicated keys, so equal sets encode equally.
func (o OwnedKeys) Encode() string {
	b, _ := json.Marshal(OwnedKeys{Labels: canonical(o.Labels), Annotations: canonical(o.Annotations), Taints: canonical(o.Taints)})
	return string(b)
}

// DecodeOwnedKeys parses an OwnedKeysAnnotation value; "" is no keys.
func DecodeOwnedKeys(s string) (OwnedKeys, error) {
	var o OwnedKeys
	if strings.TrimSpace(s) == "" {
		return o, nil
	}
	if err := json.Unmarshal([]byte(s), &o); err != nil {
		return OwnedKeys{}, fmt.Errorf("annotation %s: %w", OwnedKeysAnnotation, err)
	}
	return o, nil
}

// kubeletProtected reports whether a kubelet is not allowed to change the
// key on its own Node: taints, and labels in the kubernetes.io and k8s.io
// namespaces (NodeRestriction).
func kubeletProtectedLabel(key string) bool {
	prefix, _, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	for _, ns := range []string{"kubernetes.io", "k8s.io"} {
		if prefix == ns || strings.HasSuffix(prefix, "."+ns) {
			return true
		}
	}
	return false
}

// NodeChange is what enforce mode changes on a node so that it carries
// exactly the current rule output for the keys rules own.
type NodeChange struct {
	SetLabels         map[string]string
	RemoveLabels      []string
	SetAnnotations    map[string]string // OwnedKeysAnnotation included
	RemoveAnnotations []string
	AddTaints         []corev1.Taint
	RemoveTaints      []corev1.Taint // matched by key and effect
	// Owned is what the node owns after the change.
	Owned OwnedKeys
	// Warning notes a problem found on the way (an unreadable ownership
	// record: nothing was removed on the strength of it).
	Warning string
}

// Plan compares a node with the rule output for it and returns the change
// that reconciles them:
//
//   - every label, annotation and taint in r is set to r's value (a key is
//     owned from then on, even if it existed before);
//   - a key the node's OwnedKeysAnnotation lists that r no longer produces is
//     removed; keys that were never recorded there are never touched;
//   - the annotation is rewritten to list exactly r's keys (removed when r
//     has none).
//
// The annotation is on the Node, which its kubelet can edit. So a key the
// kubelet may not change itself (any taint; a label in the kubernetes.io or
// k8s.io namespaces) is removed only if the configuration can still produce
// it (r.Producible): a node cannot get a taint an administrator put on it
// lifted by listing it as owned. Such a key that the configuration no longer
// mentions at all stays on the node; remove it by hand.
//
// Plan is pure; a nil node or result yields an empty change.
func Plan(node *corev1.Node, r *Result) NodeChange {
	var ch NodeChange
	if node == nil || r == nil {
		return ch
	}
	current, hasRecord := node.Annotations[OwnedKeysAnnotation]
	prev, err := DecodeOwnedKeys(current)
	if err != nil {
		ch.Warning = err.Error() + "; treating it as empty"
	}
	producible := OwnedKeys{Labels: canonical(r.Producible.Labels), Taints: canonical(r.Producible.Taints)}
	has := func(sorted []string, k string) bool { _, ok := slices.BinarySearch(sorted, k); return ok }

	for _, k := range sortedKeys(r.Labels) {
		if v, ok := node.Labels[k]; !ok || v != r.Labels[k] {
			ch.setLabel(k, r.Labels[k])
		}
	}
	for _, k := range canonical(prev.Labels) {
		if _, still := r.Labels[k]; still {
			continue
		}
		if _, on := node.Labels[k]; !on {
			continue
		}
		if kubeletProtectedLabel(k) && !has(producible.Labels, k) {
			continue
		}
		ch.RemoveLabels = append(ch.RemoveLabels, k)
	}

	for _, k := range sortedKeys(r.Annotations) {
		if k == OwnedKeysAnnotation {
			continue
		}
		if v, ok := node.Annotations[k]; !ok || v != r.Annotations[k] {
			ch.setAnnotation(k, r.Annotations[k])
		}
	}
	for _, k := range canonical(prev.Annotations) {
		if _, still := r.Annotations[k]; still || k == OwnedKeysAnnotation {
			continue
		}
		if _, on := node.Annotations[k]; on {
			ch.RemoveAnnotations = append(ch.RemoveAnnotations, k)
		}
	}

	onNode := map[string]corev1.Taint{}
	for _, t := range node.Spec.Taints {
		onNode[TaintID(t)] = t
	}
	desired := map[string]bool{}
	for _, t := range r.Taints {
		id := TaintID(t)
		desired[id] = true
		cur, ok := onNode[id]
		if ok && cur.Value == t.Value {
			continue
		}
		if ok {
			ch.RemoveTaints = append(ch.RemoveTaints, cur)
		}
		ch.AddTaints = append(ch.AddTaints, t)
	}
	for _, id := range canonical(prev.Taints) {
		cur, on := onNode[id]
		if desired[id] || !on || !has(producible.Taints, id) {
			continue
		}
		ch.RemoveTaints = append(ch.RemoveTaints, cur)
	}

	ch.Owned = r.Owned()
	switch {
	case ch.Owned.Empty() && hasRecord:
		ch.RemoveAnnotations = append(ch.RemoveAnnotations, OwnedKeysAnnotation)
	case !ch.Owned.Empty():
		if enc := ch.Owned.Encode(); current != enc {
			ch.setAnnotation(OwnedKeysAnnotation, enc)
		}
	}
	return ch
}

func (c *NodeChange) setLabel(k, v string) {
	if c.SetLabels == nil {
		c.SetLabels = map[string]string{}
	}
	c.SetLabels[k] = v
}

func (c *NodeChange) setAnnotation(k, v string) {
	if c.SetAnnotations == nil {
		c.SetAnnotations = map[string]string{}
	}
	c.SetAnnotations[k] = v
}

// Empty reports whether the change changes nothing.
func (c NodeChange) Empty() bool {
	return len(c.SetLabels) == 0 && len(c.RemoveLabels) == 0 &&
		len(c.SetAnnotations) == 0 && len(c.RemoveAnnotations) == 0 &&
		len(c.AddTaints) == 0 && len(c.RemoveTaints) == 0
}

// Apply makes the change on node (in place).
func (c NodeChange) Apply(node *corev1.Node) {
	if node == nil || c.Empty() {
		return
	}
	if len(c.SetLabels) > 0 && node.Labels == nil {
		node.Labels = map[string]string{}
	}
	for k, v := range c.SetLabels {
		node.Labels[k] = v
	}
	for _, k := range c.RemoveLabels {
		delete(node.Labels, k)
	}
	if len(c.SetAnnotations) > 0 && node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	for k, v := range c.SetAnnotations {
		node.Annotations[k] = v
	}
	for _, k := range c.RemoveAnnotations {
		delete(node.Annotations, k)
	}
	if len(c.RemoveTaints) > 0 {
		gone := map[string]bool{}
		for _, t := range c.RemoveTaints {
			gone[TaintID(t)] = true
		}
		node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, func(t corev1.Taint) bool { return gone[TaintID(t)] })
	}
	for _, t := range c.AddTaints {
		id := TaintID(t)
		i := slices.IndexFunc(node.Spec.Taints, func(x corev1.Taint) bool { return TaintID(x) == id })
		if i >= 0 {
			node.Spec.Taints[i] = t
		} else {
			node.Spec.Taints = append(node.Spec.Taints, t)
		}
	}
}

// String summarises the change for an event or a log line, e.g.
// "labels +role=web -team; taints +dedicated=web:NoSchedule". Annotation
// values are left out.
func (c NodeChange) String() string {
	var parts []string
	var b []string
	for _, k := range sortedKeys(c.SetLabels) {
		b = append(b, "+"+k+"="+c.SetLabels[k])
	}
	for _, k := range c.RemoveLabels {
		b = append(b, "-"+k)
	}
	if len(b) > 0 {
		parts = append(parts, "labels "+strings.Join(b, " "))
	}
	b = nil
	for _, k := range sortedKeys(c.SetAnnotations) {
		if k != OwnedKeysAnnotation {
			b = append(b, "+"+k)
		}
	}
	for _, k := range c.RemoveAnnotations {
		if k != OwnedKeysAnnotation {
			b = append(b, "-"+k)
		}
	}
	if len(b) > 0 {
		parts = append(parts, "annotations "+strings.Join(b, " "))
	}
	b = nil
	for _, t := range c.AddTaints {
		b = append(b, "+"+taintString(t))
	}
	for _, t := range c.RemoveTaints {
		b = append(b, "-"+taintString(t))
	}
	if len(b) > 0 {
		parts = append(parts, "taints "+strings.Join(b, " "))
	}
	if len(parts) == 0 && !c.Empty() {
		return "ownership record updated"
	}
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, "; ")
}

// taintString formats a taint as kubectl does: key=value:Effect.
func taintString(t corev1.Taint) string {
	if t.Value == "" {
		return t.Key + ":" + string(t.Effect)
	}
	return t.Key + "=" + t.Value + ":" + string(t.Effect)
}
