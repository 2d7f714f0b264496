package transform

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string   // what is wrong
		doc  string   // the whole configuration
		want []string // parts the error must contain: file:line, rule, field path, message
	}{
		{
			name: "invalid regexp in a selector",
			doc: `transformations:
  - name: web-nodes
    nodeSelector:
      - matchExpressions:
          - {key: platform, operator: In, values: [metal]}
          - {key: hostname, operator: Regexp, values: ["^web-", "("]}
`,
			want: []string{"test.yaml:6:", `transformations[0] "web-nodes"`, "nodeSelector[0].matchExpressions[1].values[1]:", `invalid regexp "("`},
		},
		{name: "unknown operator", doc: oneExpression("platform", "Matches", "x"), want: []string{`transformations[0] "r"`, "nodeSelector[0].matchExpressions[0].operator:", `unknown operator "Matches"`}},
		{name: "operator in wrong case", doc: oneExpression("platform", "notin", "x"), want: []string{".operator:", "did you mean NotIn?"}},
		{name: "missing operator", doc: "transformations:\n  - nodeSelector:\n      - matchExpressions:\n          - key: zone\n", want: []string{"transformations[0]:", ".operator:", "operator is required"}},
		{name: "In without values", doc: oneExpression("platform", OpIn), want: []string{"matchExpressions[0].values:", "In needs at least one value"}},
		{name: "NotIn without values", doc: oneExpression("platform", OpNotIn), want: []string{".values:", "NotIn needs at least one value"}},
		{name: "Exists with values", doc: oneExpression("zone", OpExists, "a"), want: []string{".values:", "Exists takes no values"}},
		{name: "DoesNotExist with values", doc: oneExpression("zone", OpDoesNotExist, "a"), want: []string{".values:", "DoesNotExist takes no values"}},
		{name: "Gt with two values", doc: oneExpression("tags.n", OpGt, "1", "2"), want: []string{".values:", "exactly one integer"}},
		{name: "Lt with a non-integer", doc: oneExpression("tags.n", OpLt, "ten"), want: []string{".values[0]:", `Lt needs an integer, got "ten"`}},
		{name: "Regexp without values", doc: oneExpression("hostname", OpRegexp), want: []string{".values:", "at least one pattern"}},
		{name: "unknown key", doc: oneExpression("colour", OpExists), want: []string{"matchExpressions[0].key:", `unknown metadata key "colour"`, "tags.<name>"}},
		{name: "tags without a name", doc: oneExpression("tags.", OpExists), want: []string{".key:", `unknown metadata key "tags."`}},
		{name: "missing key", doc: "transformations:\n  - nodeSelector:\n      - matchExpressions:\n          - operator: Exists\n", want: []string{".key:", "key is required"}},
		{name: "empty term", doc: "transformations:\n  - name: e\n    nodeSelector:\n      - matchExpressions: []\n", want: []string{`"e"`, "nodeSelector[0].matchExpressions:", "must not be empty"}},
		{name: "invalid label key", doc: "transformations:\n  - name: l\n    labels:\n      'bad key!': x\n", want: []string{"test.yaml:4:", `labels["bad key!"]:`, "invalid label key"}},
		{name: "invalid literal label value", doc: "transformations:\n  - labels:\n      example.com/a: 'has space'\n", want: []string{"transformations[0]:", `labels["example.com/a"]:`, `invalid label value "has space"`}},
		{name: "label value too long", doc: "transformations:\n  - labels:\n      a: '" + strings.Repeat("x", 64) + "'\n", want: []string{`labels["a"]:`, "must be no more than 63"}},
		{name: "label talos-ccm derives", doc: "transformations:\n  - labels:\n      topology.kubernetes.io/zone: z\n", want: []string{`labels["topology.kubernetes.io/zone"]:`, "override platformMetadata.zone instead"}},
		{name: "routing label", doc: "transformations:\n  - labels:\n      node.cloudprovider.kubernetes.io/platform: aws\n", want: []string{"routing label", "override platformMetadata.platform instead"}},
		{name: "invalid annotation key", doc: "transformations:\n  - annotations:\n      'a/b/c': x\n", want: []string{`annotations["a/b/c"]:`, "invalid annotation key"}},
		{name: "ownership annotation", doc: "transformations:\n  - annotations:\n      " + OwnedKeysAnnotation + ": x\n", want: []string{"rules may not set this annotation", "enforce mode"}},
		{name: "taint without key", doc: "transformations:\n  - taints:\n      - {value: x, effect: NoSchedule}\n", want: []string{"taints[0].key:", "key is required"}},
		{name: "invalid taint key", doc: "transformations:\n  - taints:\n      - {key: 'a b', effect: NoSchedule}\n", want: []string{"taints[0].key:", `invalid taint key "a b"`}},
		{name: "invalid taint effect", doc: "transformations:\n  - name: t\n    taints:\n      - {key: a, effect: NoScedule}\n", want: []string{"test.yaml:4:", `"t"`, "taints[0].effect:", `invalid taint effect "NoScedule"`}},
		{name: "missing taint effect", doc: "transformations:\n  - taints:\n      - {key: a}\n", want: []string{"taints[0].effect:", `invalid taint effect ""`}},
		{name: "invalid literal taint value", doc: "transformations:\n  - taints:\n      - {key: a, value: 'x y', effect: NoSchedule}\n", want: []string{"taints[0].value:", `invalid taint value "x y"`}},
		{name: "reserved taint", doc: "transformations:\n  - taints:\n      - {key: node.kubernetes.io/not-ready, effect: NoExecute}\n", want: []string{"taints[0].key:", "rules may not set taint"}},
		{name: "uninitialized taint", doc: "transformations:\n  - taints:\n      node.cloudprovider.kubernetes.io/uninitialized: NoSchedule\n", want: []string{`taints["node.cloudprovider.kubernetes.io/uninitialized"]:`, "rules may not set taint"}},
		{name: "map taint with a bad effect", doc: "transformations:\n  - taints:\n      dedicated: 'web:NoScedule'\n", want: []string{`taints["dedicated"]:`, `invalid taint effect "NoScedule"`}},
		{name: "map taint with a templated effect", doc: "transformations:\n  - taints:\n      dedicated: '{{ .Zone }}'\n", want: []string{`taints["dedicated"]:`, "invalid taint effect", `"value:Effect"`}},
		{name: "map taint with two colons", doc: "transformations:\n  - taints:\n      dedicated: 'a:b:NoSchedule'\n", want: []string{`taints["dedicated"]:`, `invalid taint value "a:b"`}},
		{name: "taints of the wrong shape", doc: "transformations:\n  - taints: NoSchedule\n", want: []string{"taints:", "must be a list of {key, value, effect} or a map"}},
		{name: "unknown platformMetadata field", doc: "transformations:\n  - platformMetadata:\n      colour: red\n", want: []string{`platformMetadata["colour"]:`, "unknown metadata field", "instanceType"}},
		{name: "empty platform override", doc: "transformations:\n  - platformMetadata:\n      Platform: ''\n", want: []string{`platformMetadata["Platform"]:`, "platform must not be empty"}},
		{name: "invalid platform override", doc: "transformations:\n  - platformMetadata:\n      platform: 'open stack'\n", want: []string{`platformMetadata["platform"]:`, `platform "open stack" is not a valid label value`}},
		{name: "hostname override", doc: "transformations:\n  - platformMetadata:\n      hostname: x\n", want: []string{"hostname cannot be overridden"}},
		{name: "hardware override", doc: "transformations:\n  - platformMetadata:\n      serialNumber: x\n", want: []string{"serialNumber is hardware information"}},
		{name: "same field overridden twice", doc: "transformations:\n  - platformMetadata:\n      Region: a\n      region: b\n", want: []string{`platformMetadata["region"]:`, "already overridden"}},
		{name: "literal spot override", doc: "transformations:\n  - platformMetadata:\n      spot: maybe\n", want: []string{`platformMetadata["spot"]:`, "spot must render to true or false"}},
		{name: "template error in an override", doc: "transformations:\n  - platformMetadata:\n      zone: '{{ .Zone'\n", want: []string{`platformMetadata["zone"]:`, "invalid template"}},
		{name: "duplicate rule names", doc: "transformations:\n  - name: a\n  - name: b\n  - name: a\n", want: []string{"test.yaml:4:", `transformations[2] "a": name:`, "duplicate rule name (also transformations[0])"}},
		{name: "unknown rule field", doc: "transformations:\n  - name: u\n    label:\n      a: b\n", want: []string{"test.yaml:3:", `"u"`, "label: unknown field", `did you mean "labels"?`}},
		{name: "upstream-style wrong case in a rule field", doc: "transformations:\n  - NodeSelector: []\n", want: []string{"NodeSelector: unknown field", `did you mean "nodeSelector"?`}},
		{name: "unknown expression field", doc: "transformations:\n  - nodeSelector:\n      - matchExpressions:\n          - {key: zone, operator: In, value: [a]}\n", want: []string{"matchExpressions[0].value: unknown field", "key, operator, values"}},
		{name: "unknown feature", doc: "transformations:\n  - features:\n      publicIP: true\n", want: []string{"features.publicIP: unknown field"}},
		{name: "feature not a bool", doc: "transformations:\n  - features:\n      publicIPDiscovery: sometimes\n", want: []string{"features.publicIPDiscovery:", "must be true or false"}},
		{name: "unknown global field", doc: "global:\n  clustername: x\n", want: []string{"test.yaml:2:", "global.clustername: unknown field", `did you mean "clusterName"?`}},
		{name: "global.endpoints not a list", doc: "global:\n  endpoints: 10.0.0.2\n", want: []string{"test.yaml:2:", "global.endpoints: must be a list"}},
		{name: "global.endpoints empty entry", doc: "global:\n  endpoints: [10.0.0.2, '']\n", want: []string{"global.endpoints[1]: must be a Talos API endpoint"}},
		{name: "global field in both spellings", doc: "global:\n  preferIPv6: true\n  PreferIPv6: false\n", want: []string{"global.PreferIPv6: duplicate key (first on line 2)"}},
		{name: "unknown top-level field", doc: "transformation: []\n", want: []string{"test.yaml:1:", "transformation: unknown field"}},
		{name: "labels as a list", doc: "transformations:\n  - labels: [a, b]\n", want: []string{"labels: must be a mapping, not a list"}},
		{name: "nested label value", doc: "transformations:\n  - labels:\n      a: {b: c}\n", want: []string{`labels["a"]: must be a string, not a mapping`}},
		{name: "duplicate label", doc: "transformations:\n  - labels:\n      a: x\n      a: y\n", want: []string{"test.yaml:4:", `labels["a"]: duplicate key`}},
		{name: "values as a scalar", doc: "transformations:\n  - nodeSelector:\n      - matchExpressions:\n          - {key: zone, operator: In, values: fra1}\n", want: []string{".values: must be a list"}},
		{name: "transformations as a mapping", doc: "transformations:\n  a: b\n", want: []string{"transformations: must be a list"}},
		{name: "rule as a scalar", doc: "transformations:\n  - web\n", want: []string{"transformations[0]:", "a rule must be a mapping"}},
		{name: "YAML syntax", doc: "transformations:\n  - name: [\n", want: []string{"test.yaml:", "yaml:"}},
		{name: "two documents", doc: "global: {}\n---\nglobal: {}\n", want: []string{"test.yaml:", "more than one YAML document"}},
		{name: "document not a mapping", doc: "- a\n", want: []string{"must be a mapping"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.doc), "test.yaml")
			if err == nil {
				t.Fatalf("Parse succeeded (%+v), want an error", c.Transformations)
			}
			for _, part := range tt.want {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error\n  %v\ndoes not contain\n  %s", err, part)
				}
			}
		})
	}
}

func TestParseReportsAllErrorsInFileOrder(t *testing.T) {
	_, err := Load("testdata/invalid.yaml")
	if err == nil {
		t.Fatal("Load succeeded, want errors")
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("error %T is not a joined error", err)
	}
	var lines []int
	for _, e := range joined.Unwrap() {
		var fe *Error
		if !errors.As(e, &fe) {
			t.Fatalf("%v is not an *Error", e)
		}
		if fe.Source != "testdata/invalid.yaml" || fe.Rule == "" || fe.Field == "" {
			t.Errorf("error without file, rule or field: %#v", fe)
		}
		lines = append(lines, fe.Line)
	}
	if want := []int{10, 12, 13, 15}; !reflect.DeepEqual(lines, want) {
		t.Errorf("error lines = %v, want %v", lines, want)
	}
}

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name  string                    // what is accepted
		doc   string                    // the configuration
		check func(*testing.T, *Config) // what it must have produced
	}{
		{name: "empty file", doc: "", check: func(t *testing.T, c *Config) {
			if len(c.Transformations) != 0 || !reflect.DeepEqual(c.Global, Global{}) {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "comments only", doc: "# nothing\n", check: func(t *testing.T, c *Config) {}},
		{name: "empty mapping", doc: "{}", check: func(t *testing.T, c *Config) {}},
		{name: "JSON", doc: `{"global": {"clusterName": "j"}, "transformations": [{"labels": {"a": "b"}}]}`, check: func(t *testing.T, c *Config) {
			if c.Global.ClusterName != "j" || c.Transformations[0].Labels["a"] != "b" {
				t.Errorf("got %+v", c)
			}
		}},
		{name: "upstream global spellings", doc: "global:\n  PreferIPv6: true\n  ClusterName: up\n  Enforce: yes\n  Endpoints: [10.0.0.2]\n", check: func(t *testing.T, c *Config) {
			if !reflect.DeepEqual(c.Global, Global{ClusterName: "up", PreferIPv6: true, Enforce: true, Endpoints: []string{"10.0.0.2"}}) {
				t.Errorf("Global = %+v", c.Global)
			}
		}},
		{name: "upstream global.endpoints", doc: "global:\n  endpoints:\n    - 10.0.0.2\n    - cp.example.com:50000\n", check: func(t *testing.T, c *Config) {
			if !reflect.DeepEqual(c.Global.Endpoints, []string{"10.0.0.2", "cp.example.com:50000"}) {
				t.Errorf("endpoints = %q", c.Global.Endpoints)
			}
		}},
		{name: "quoted booleans", doc: "global:\n  preferIPv6: 'true'\n", check: func(t *testing.T, c *Config) {
			if !c.Global.PreferIPv6 {
				t.Error("preferIPv6 not set")
			}
		}},
		{name: "scalar values of any type become strings", doc: oneExpression("tags.n", OpGt, "1") + "    labels:\n      a: 12\n      b: true\n      c:\n", check: func(t *testing.T, c *Config) {
			if l := c.Transformations[0].Labels; l["a"] != "12" || l["b"] != "true" || l["c"] != "" {
				t.Errorf("Labels = %v", l)
			}
		}},
		{name: "anchors, aliases and merge keys", doc: `
transformations:
  - name: a
    nodeSelector: &sel
      - matchExpressions: [{key: platform, operator: In, values: [metal]}]
    labels: &common
      team: infra
  - name: b
    nodeSelector: *sel
    labels:
      <<: *common
      role: web
`, check: func(t *testing.T, c *Config) {
			b := c.Transformations[1]
			if len(b.NodeSelector) != 1 || b.Labels["team"] != "infra" || b.Labels["role"] != "web" {
				t.Errorf("rule b = %+v", b)
			}
		}},
		{name: "explicit keys win over merged ones", doc: "transformations:\n  - labels:\n      <<: {team: a, x: m}\n      team: b\n", check: func(t *testing.T, c *Config) {
			if l := c.Transformations[0].Labels; l["team"] != "b" || l["x"] != "m" {
				t.Errorf("Labels = %v", l)
			}
		}},
		{name: "both taint forms", doc: `
transformations:
  - taints:
      a: NoSchedule
      b: "v:NoExecute"
      c: "{{ .Zone }}:PreferNoSchedule"
  - taints:
      - {key: d, effect: NoSchedule}
      - {key: e, value: "{{ .Zone }}", effect: NoExecute}
`, check: func(t *testing.T, c *Config) {
			res, err := c.Apply(Metadata{Zone: "z1"})
			if err != nil {
				t.Fatal(err)
			}
			want := []corev1.Taint{
				{Key: "a", Effect: corev1.TaintEffectNoSchedule},
				{Key: "b", Value: "v", Effect: corev1.TaintEffectNoExecute},
				{Key: "c", Value: "z1", Effect: corev1.TaintEffectPreferNoSchedule},
				{Key: "d", Effect: corev1.TaintEffectNoSchedule},
				{Key: "e", Value: "z1", Effect: corev1.TaintEffectNoExecute},
			}
			if !reflect.DeepEqual(res.Taints, want) {
				t.Errorf("Taints = %+v, want %+v", res.Taints, want)
			}
		}},
		{name: "empty nodeSelector matches every node", doc: "transformations:\n  - nodeSelector: []\n    labels: {a: b}\n", check: func(t *testing.T, c *Config) {
			if res, _ := c.Apply(Metadata{}); res.Labels["a"] != "b" {
				t.Errorf("Labels = %v", res.Labels)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, mustParse(t, tt.doc))
		})
	}
}

func TestLoad(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load of a missing file: %v, want an error naming it", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, []byte("#"+strings.Repeat("x", MaxConfigBytes)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "big.yaml: file larger than") {
		t.Errorf("Load of a big file: %v", err)
	}
	for _, f := range []string{"testdata/upstream.yaml", "testdata/full.yaml"} {
		c, err := Load(f)
		if err != nil {
			t.Fatalf("Load(%s): %v", f, err)
		}
		if c.Source() != f {
			t.Errorf("Source = %q, want %q", c.Source(), f)
		}
	}
}

func TestAliasBomb(t *testing.T) {
	// Merge keys nine deep, nine wide: 9^9 entries if expanded naively.
	var b strings.Builder
	b.WriteString("x0: &m0 {a: b}\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "x%d: &m%d {<<: [", i, i)
		for j := 0; j < 9; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*m%d", i-1)
		}
		b.WriteString("]}\n")
	}
	b.WriteString("transformations:\n  - labels: *m9\n")
	start := time.Now()
	_, err := Parse([]byte(b.String()), "bomb.yaml")
	if err == nil || !strings.Contains(err.Error(), "document too complex") {
		t.Errorf("Parse: %v, want a too-complex error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Parse took %v", d)
	}
}
