package app

import (
	"maps"
	"strings"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// decoded returns a Node as a decoder makes it: every string its own copy.
func decoded(name, zone string) *corev1.Node {
	own := func(s string) string { return string([]byte(s)) }
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				own("topology.kubernetes.io/zone"): own(zone),
				own("kubernetes.io/hostname"):      own(name),
			},
			Annotations:   map[string]string{own("alpha.kubernetes.io/provided-node-ip"): own("10.0.0.1")},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: "v1.36.3"},
		},
	}
}

func sameMemory(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// keyOf returns m's own copy of the key equal to k.
func keyOf(m map[string]string, k string) string {
	for kk := range m {
		if kk == k {
			return kk
		}
	}
	return ""
}

// The cache keeps a Node's labels, annotations and addresses as they were
// (cloud-node updates Nodes from it), drops managed fields and the rest of
// the status, and two nodes share their common label keys and values and
// annotation keys, not what differs between them nor annotation values.
func TestSlimNodeSharesCommonStrings(t *testing.T) {
	old := nodeStrings
	nodeStrings = &internTable{max: maxInterned}
	t.Cleanup(func() { nodeStrings = old })

	a, b := decoded("node-a", "zone-1"), decoded("node-b", "zone-1")
	wantLabels, wantAnnotations := maps.Clone(a.Labels), maps.Clone(a.Annotations)
	for _, n := range []*corev1.Node{a, b} {
		if _, err := slimNode(n); err != nil {
			t.Fatal(err)
		}
	}
	if !maps.Equal(a.Labels, wantLabels) || !maps.Equal(a.Annotations, wantAnnotations) {
		t.Fatalf("labels %v annotations %v, want %v and %v", a.Labels, a.Annotations, wantLabels, wantAnnotations)
	}
	if a.ManagedFields != nil || a.Status.Conditions != nil || a.Status.NodeInfo.KubeletVersion != "" || len(a.Status.Addresses) != 1 {
		t.Fatalf("slim node kept %+v %+v", a.ManagedFields, a.Status)
	}
	const zone, host, ip = "topology.kubernetes.io/zone", "kubernetes.io/hostname", "alpha.kubernetes.io/provided-node-ip"
	if !sameMemory(keyOf(a.Labels, zone), keyOf(b.Labels, zone)) || !sameMemory(a.Labels[zone], b.Labels[zone]) {
		t.Error("the zone label's key and value are not shared between the two nodes")
	}
	if !sameMemory(keyOf(a.Annotations, ip), keyOf(b.Annotations, ip)) {
		t.Error("the annotation key is not shared")
	}
	if sameMemory(a.Annotations[ip], b.Annotations[ip]) {
		t.Error("an annotation value was shared: annotation values are free text and stay the node's own")
	}
	if a.Labels[host] != "node-a" || b.Labels[host] != "node-b" {
		t.Errorf("hostname labels %q and %q", a.Labels[host], b.Labels[host])
	}
}

// The table never holds more than its bound nor strings longer than a
// qualified key; past the bound strings are still returned, unshared.
func TestInternTableBounds(t *testing.T) {
	tab := &internTable{max: 3}
	for _, s := range []string{"a", "b", "a", "c", "d", "e"} {
		if got := tab.shared(map[string]string{s: s}, true); got[s] != s {
			t.Fatalf("shared(%q) = %v", s, got)
		}
	}
	if n := tab.size(); n != 3 {
		t.Errorf("table holds %d strings, want its bound 3", n)
	}
	long := strings.Repeat("x", maxInternedLen+1)
	tab = &internTable{max: 10}
	if got := tab.shared(map[string]string{long: "v"}, false); got[long] != "v" || tab.size() != 0 {
		t.Errorf("a %d-byte key: got %v, table holds %d", len(long), got, tab.size())
	}
	if got := tab.shared(nil, true); got != nil {
		t.Errorf("shared(nil) = %v", got)
	}
}
