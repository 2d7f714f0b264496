package transform

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func taint(key, value string, effect corev1.TaintEffect) corev1.Taint {
	return corev1.Taint{Key: key, Value: value, Effect: effect}
}

const (
	noSchedule = corev1.TaintEffectNoSchedule
	noExecute  = corev1.TaintEffectNoExecute
)

func owned(labels, annotations, taints []string) string {
	return OwnedKeys{Labels: labels, Annotations: annotations, Taints: taints}.Encode()
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name string // case

		// the node before
		labels      map[string]string
		annotations map[string]string // OwnedKeysAnnotation included when the node has a record
		taints      []corev1.Taint

		// the rule output now
		result *Result

		// the node after Plan(...).Apply
		wantLabels      map[string]string
		wantAnnotations map[string]string // OwnedKeysAnnotation included
		wantTaints      []corev1.Taint
		wantEmpty       bool   // the change is empty
		wantWarning     string // part of NodeChange.Warning
	}{
		{
			name:   "fresh node gets everything and a record",
			labels: map[string]string{"kubernetes.io/hostname": "web-1"},
			result: &Result{
				Labels:      map[string]string{"role": "web"},
				Annotations: map[string]string{"example.com/note": "n"},
				Taints:      []corev1.Taint{taint("dedicated", "web", noSchedule)},
			},
			wantLabels: map[string]string{"kubernetes.io/hostname": "web-1", "role": "web"},
			wantAnnotations: map[string]string{
				"example.com/note":  "n",
				OwnedKeysAnnotation: owned([]string{"role"}, []string{"example.com/note"}, []string{"dedicated:NoSchedule"}),
			},
			wantTaints: []corev1.Taint{taint("dedicated", "web", noSchedule)},
		},
		{
			name:        "reconciled node: no change",
			labels:      map[string]string{"role": "web"},
			annotations: map[string]string{OwnedKeysAnnotation: owned([]string{"role"}, nil, nil)},
			result:      &Result{Labels: map[string]string{"role": "web"}},
			wantLabels:  map[string]string{"role": "web"},
			wantAnnotations: map[string]string{
				OwnedKeysAnnotation: owned([]string{"role"}, nil, nil),
			},
			wantEmpty: true,
		},
		{
			name:        "changed values are rewritten, a taint value in place",
			labels:      map[string]string{"role": "web"},
			annotations: map[string]string{"example.com/note": "old", OwnedKeysAnnotation: owned([]string{"role"}, []string{"example.com/note"}, []string{"dedicated:NoSchedule"})},
			taints:      []corev1.Taint{taint("admin", "", noExecute), taint("dedicated", "web", noSchedule)},
			result: &Result{
				Labels:      map[string]string{"role": "db"},
				Annotations: map[string]string{"example.com/note": "new"},
				Taints:      []corev1.Taint{taint("dedicated", "db", noSchedule)},
				Producible:  OwnedKeys{Taints: []string{"dedicated:NoSchedule"}},
			},
			wantLabels:      map[string]string{"role": "db"},
			wantAnnotations: map[string]string{"example.com/note": "new", OwnedKeysAnnotation: owned([]string{"role"}, []string{"example.com/note"}, []string{"dedicated:NoSchedule"})},
			wantTaints:      []corev1.Taint{taint("admin", "", noExecute), taint("dedicated", "db", noSchedule)},
		},
		{
			name:   "owned keys no longer produced are removed, others untouched",
			labels: map[string]string{"role": "web", "old": "x", "admin": "keep"},
			annotations: map[string]string{
				"example.com/old": "x", "example.com/admin": "keep",
				OwnedKeysAnnotation: owned([]string{"role", "old"}, []string{"example.com/old"}, []string{"gone:NoSchedule"}),
			},
			taints: []corev1.Taint{taint("gone", "", noSchedule), taint("gone", "", noExecute), taint("admin", "", noSchedule)},
			result: &Result{
				Labels:     map[string]string{"role": "web"},
				Producible: OwnedKeys{Labels: []string{"old", "role"}, Annotations: []string{"example.com/old"}, Taints: []string{"gone:NoSchedule"}},
			},
			wantLabels:      map[string]string{"role": "web", "admin": "keep"},
			wantAnnotations: map[string]string{"example.com/admin": "keep", OwnedKeysAnnotation: owned([]string{"role"}, nil, nil)},
			wantTaints:      []corev1.Taint{taint("gone", "", noExecute), taint("admin", "", noSchedule)},
		},
		{
			name:        "an owned key someone already removed stays removed",
			labels:      map[string]string{},
			annotations: map[string]string{OwnedKeysAnnotation: owned([]string{"old"}, nil, nil)},
			result:      &Result{Labels: map[string]string{"role": "web"}, Producible: OwnedKeys{Labels: []string{"old", "role"}}},
			wantLabels:  map[string]string{"role": "web"},
			wantAnnotations: map[string]string{
				OwnedKeysAnnotation: owned([]string{"role"}, nil, nil),
			},
		},
		{
			name:       "a pre-existing key a rule now produces is taken over",
			labels:     map[string]string{"role": "manual"},
			result:     &Result{Labels: map[string]string{"role": "web"}},
			wantLabels: map[string]string{"role": "web"},
			wantAnnotations: map[string]string{
				OwnedKeysAnnotation: owned([]string{"role"}, nil, nil),
			},
		},
		{
			name: "kubelet-protected keys the configuration cannot produce are never removed",
			labels: map[string]string{
				"node-restriction.kubernetes.io/quarantine": "true", // protected, not producible: stays
				"example.k8s.io/x":                          "1",    // protected, producible: removed
				"example.com/free":                          "1",    // not protected: removed on the record alone
			},
			annotations: map[string]string{
				OwnedKeysAnnotation: owned(
					[]string{"node-restriction.kubernetes.io/quarantine", "example.k8s.io/x", "example.com/free"},
					nil,
					[]string{"quarantine:NoExecute", "spot:PreferNoSchedule"},
				),
			},
			taints: []corev1.Taint{taint("quarantine", "", noExecute), taint("spot", "", corev1.TaintEffectPreferNoSchedule)},
			result: &Result{Producible: OwnedKeys{Labels: []string{"example.k8s.io/x"}, Taints: []string{"spot:PreferNoSchedule"}}},
			wantLabels: map[string]string{
				"node-restriction.kubernetes.io/quarantine": "true",
			},
			wantAnnotations: map[string]string{},
			wantTaints:      []corev1.Taint{taint("quarantine", "", noExecute)},
		},
		{
			name:            "no output and no record: nothing to do",
			labels:          map[string]string{"a": "b"},
			result:          &Result{},
			wantLabels:      map[string]string{"a": "b"},
			wantAnnotations: map[string]string{},
			wantEmpty:       true,
		},
		{
			name:        "an unreadable record removes nothing and is replaced",
			labels:      map[string]string{"old": "x"},
			annotations: map[string]string{OwnedKeysAnnotation: "{not json"},
			result:      &Result{Labels: map[string]string{"role": "web"}, Producible: OwnedKeys{Labels: []string{"old", "role"}}},
			wantLabels:  map[string]string{"old": "x", "role": "web"},
			wantAnnotations: map[string]string{
				OwnedKeysAnnotation: owned([]string{"role"}, nil, nil),
			},
			wantWarning: "treating it as empty",
		},
		{
			name:            "a rule cannot claim the record itself",
			annotations:     map[string]string{OwnedKeysAnnotation: owned(nil, []string{OwnedKeysAnnotation}, nil)},
			result:          &Result{},
			wantAnnotations: map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node := &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: maps.Clone(tt.labels), Annotations: maps.Clone(tt.annotations)},
				Spec:       corev1.NodeSpec{Taints: slices.Clone(tt.taints)},
			}
			before := node.DeepCopy()
			ch := Plan(node, tt.result)
			if !reflect.DeepEqual(node, before) {
				t.Fatal("Plan changed the node")
			}
			if ch.Empty() != tt.wantEmpty {
				t.Errorf("Empty = %v, want %v (change: %s)", ch.Empty(), tt.wantEmpty, ch)
			}
			if !strings.Contains(ch.Warning, tt.wantWarning) || tt.wantWarning == "" && ch.Warning != "" {
				t.Errorf("Warning = %q, want %q", ch.Warning, tt.wantWarning)
			}
			ch.Apply(node)
			if got := orEmpty(node.Labels); !reflect.DeepEqual(got, orEmpty(tt.wantLabels)) {
				t.Errorf("labels = %v, want %v", got, tt.wantLabels)
			}
			if got := orEmpty(node.Annotations); !reflect.DeepEqual(got, orEmpty(tt.wantAnnotations)) {
				t.Errorf("annotations = %v, want %v", got, tt.wantAnnotations)
			}
			if !reflect.DeepEqual(node.Spec.Taints, tt.wantTaints) && len(node.Spec.Taints)+len(tt.wantTaints) > 0 {
				t.Errorf("taints = %+v, want %+v", node.Spec.Taints, tt.wantTaints)
			}
			if again := Plan(node, tt.result); !again.Empty() {
				t.Errorf("second Plan is not empty: %s", again)
			}
		})
	}
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func TestPlanNil(t *testing.T) {
	if ch := Plan(nil, &Result{}); !ch.Empty() {
		t.Errorf("Plan(nil node) = %s", ch)
	}
	if ch := Plan(&corev1.Node{}, nil); !ch.Empty() {
		t.Errorf("Plan(nil result) = %s", ch)
	}
	NodeChange{SetLabels: map[string]string{"a": "b"}}.Apply(nil) // must not panic
}

func TestPlanWithApply(t *testing.T) {
	// The path the controller takes: rules → Result → Plan on the live node.
	c := mustParse(t, `
global: {enforce: true}
transformations:
  - name: web
    nodeSelector:
      - matchExpressions: [{key: hostname, operator: Regexp, values: ["^web-"]}]
    labels: {example.com/role: web}
    taints: {example.com/web: "true:NoSchedule"}
`)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "web-1"}}
	res, err := c.Apply(Metadata{Hostname: "web-1"})
	if err != nil {
		t.Fatal(err)
	}
	Plan(node, res).Apply(node)
	if node.Labels["example.com/role"] != "web" || len(node.Spec.Taints) != 1 {
		t.Fatalf("node after first reconcile: %+v", node)
	}
	// The host is renamed: the rule no longer matches; its output goes.
	res, err = c.Apply(Metadata{Hostname: "db-1"})
	if err != nil {
		t.Fatal(err)
	}
	ch := Plan(node, res)
	if got, want := ch.String(), "labels -example.com/role; taints -example.com/web=true:NoSchedule"; got != want {
		t.Errorf("change = %q, want %q", got, want)
	}
	ch.Apply(node)
	if len(node.Labels) != 0 || len(node.Spec.Taints) != 0 || len(node.Annotations) != 0 {
		t.Errorf("node after second reconcile: %+v", node)
	}
}

func TestNodeChangeString(t *testing.T) {
	tests := []struct {
		name string     // case
		ch   NodeChange // change
		want string     // String()
	}{
		{name: "empty", ch: NodeChange{}, want: "no change"},
		{name: "record only", ch: NodeChange{SetAnnotations: map[string]string{OwnedKeysAnnotation: "{}"}}, want: "ownership record updated"},
		{name: "everything", ch: NodeChange{
			SetLabels:         map[string]string{"b": "2", "a": "1"},
			RemoveLabels:      []string{"c"},
			SetAnnotations:    map[string]string{"x": "long value not shown", OwnedKeysAnnotation: "{}"},
			RemoveAnnotations: []string{"y"},
			AddTaints:         []corev1.Taint{taint("t", "v", noSchedule)},
			RemoveTaints:      []corev1.Taint{taint("u", "", noExecute)},
		}, want: "labels +a=1 +b=2 -c; annotations +x -y; taints +t=v:NoSchedule -u:NoExecute"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.ch.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestOwnedKeysEncoding(t *testing.T) {
	o := OwnedKeys{Labels: []string{"b", "a", "b"}, Taints: []string{"t:NoSchedule"}}
	enc := o.Encode()
	if want := `{"labels":["a","b"],"taints":["t:NoSchedule"]}`; enc != want {
		t.Errorf("Encode = %s, want %s", enc, want)
	}
	got, err := DecodeOwnedKeys(enc)
	if err != nil || !reflect.DeepEqual(got, OwnedKeys{Labels: []string{"a", "b"}, Taints: []string{"t:NoSchedule"}}) {
		t.Errorf("Decode = %+v, %v", got, err)
	}
	if got, err := DecodeOwnedKeys(""); err != nil || !got.Empty() {
		t.Errorf(`Decode("") = %+v, %v`, got, err)
	}
	if _, err := DecodeOwnedKeys("[1]"); err == nil || !strings.Contains(err.Error(), OwnedKeysAnnotation) {
		t.Errorf("Decode of garbage: %v", err)
	}
}
