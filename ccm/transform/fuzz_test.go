package transform

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// fuzzMetadata is what every configuration that parses is applied to.
var fuzzMetadata = []Metadata{
	{},
	sample,
	{Platform: "aws", Hostname: "ip-10-0-0-1.ec2.internal", Region: "us-east-1", Zone: "us-east-1a", InstanceID: "i-0abc", Spot: true, Tags: map[string]string{"": "", "a.b": "{{"}},
	{Hostname: strings.Repeat("x", 300), Zone: "-1", InstanceID: "9223372036854775808", Tags: map[string]string{"n": "-9223372036854775808"}},
}

// FuzzParse: parsing arbitrary bytes never panics and every error names the
// file; a configuration that parses applies to any metadata without panicking,
// produces only values Kubernetes accepts, and enforce planning converges.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.yaml")
	for _, s := range seeds {
		if b, err := os.ReadFile(s); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"",
		"global: {PreferIPv6: true}",
		oneExpression("tags.n", OpGt, "3"),
		oneExpression("hostname", OpRegexp, "^web-(\\d+)$"),
		"transformations:\n  - labels: {a: '{{ .Hostname | trimSuffix \".internal\" | replace \".\" \"-\" }}'}\n",
		"transformations:\n  - taints: {t: '{{ .Zone }}:NoSchedule'}\n    platformMetadata: {zone: '{{ .Zone }}x', spot: '{{ not .Spot }}'}\n",
		"transformations:\n  - annotations: {a: '{{ range $k, $v := .Tags }}{{ $k }}={{ $v }},{{ end }}'}\n",
		"a: &a [*a]",
		"transformations: [{labels: {<<: {a: b}}}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.yaml")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Errorf("error does not name the file: %v", err)
			}
			return
		}
		c.NeedsSystemInformation()
		for _, md := range fuzzMetadata {
			ex, err := c.Explain(md)
			if err != nil {
				continue
			}
			res := ex.Result
			for k, v := range res.Labels {
				if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
					t.Errorf("invalid label %q=%q", k, v)
				}
			}
			for _, tt := range res.Taints {
				if len(validation.IsValidLabelValue(tt.Value)) > 0 {
					t.Errorf("invalid taint value %q", tt.Value)
				}
			}
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"keep": "me"}}}
			Plan(node, res).Apply(node)
			if again := Plan(node, res); !again.Empty() {
				t.Errorf("Plan does not converge: %s", again)
			}
			if node.Labels["keep"] != "me" {
				t.Error("Plan removed a key it does not own")
			}
		}
	})
}
