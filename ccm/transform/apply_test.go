package transform

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestApplyOrderAndOverrides(t *testing.T) {
	const doc = `
transformations:
  - name: first
    labels:
      example.com/zone: "{{ .Zone }}"
      example.com/role: first
    annotations:
      example.com/note: first
    taints:
      - {key: example.com/t, value: first, effect: NoSchedule}
    platformMetadata:
      zone: "{{ .Zone }}-a"
      region: "{{ .Zone }}"
  - nodeSelector:                # sees the zone the first rule wrote
      - matchExpressions: [{key: zone, operator: In, values: [fra1-a]}]
    labels:
      example.com/role: second     # later value wins
      example.com/seen-zone: "{{ .Zone }}"
    taints:
      - {key: example.com/t, value: second, effect: NoSchedule}    # replaces first's
      - {key: example.com/t, value: other, effect: NoExecute}      # another effect: another taint
    platformMetadata:
      zone: "{{ .Zone }}-b"
      tags.rack: r1
      spot: "false"
  - name: not-matching
    nodeSelector:
      - matchExpressions: [{key: zone, operator: In, values: [fra1]}]
    labels:
      example.com/never: x
  - name: features
    nodeSelector:
      - matchExpressions: [{key: tags.rack, operator: Exists}]
    features:
      publicIPDiscovery: true
  - name: features-off-does-not-reset
    features:
      publicIPDiscovery: false
`
	in := sample.clone()
	res, err := mustParse(t, doc).Apply(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"first", "#1", "features", "features-off-does-not-reset"}; !reflect.DeepEqual(res.Matched, want) {
		t.Errorf("Matched = %v, want %v", res.Matched, want)
	}
	wantLabels := map[string]string{
		"example.com/zone":      "fra1",   // rendered before first's own override
		"example.com/role":      "second", // later rule wins
		"example.com/seen-zone": "fra1-a", // rendered before #1's own override
	}
	if !reflect.DeepEqual(res.Labels, wantLabels) {
		t.Errorf("Labels = %v, want %v", res.Labels, wantLabels)
	}
	wantTaints := []corev1.Taint{
		{Key: "example.com/t", Value: "second", Effect: corev1.TaintEffectNoSchedule},
		{Key: "example.com/t", Value: "other", Effect: corev1.TaintEffectNoExecute},
	}
	if !reflect.DeepEqual(res.Taints, wantTaints) {
		t.Errorf("Taints = %+v, want %+v", res.Taints, wantTaints)
	}
	md := res.Metadata
	if md.Zone != "fra1-a-b" || md.Region != "fra1" || md.Spot || md.Tags["rack"] != "r1" || md.Tags["env"] != "prod" {
		t.Errorf("Metadata = %+v", md)
	}
	if !res.Features.PublicIPDiscovery {
		t.Error("PublicIPDiscovery not set by the matched rule")
	}
	if !reflect.DeepEqual(in, sample) {
		t.Errorf("Apply changed its input: %+v", in)
	}
	wantProducible := OwnedKeys{
		Labels:      []string{"example.com/never", "example.com/role", "example.com/seen-zone", "example.com/zone"},
		Annotations: []string{"example.com/note"},
		Taints:      []string{"example.com/t:NoExecute", "example.com/t:NoSchedule"},
	}
	if !reflect.DeepEqual(res.Producible, wantProducible) {
		t.Errorf("Producible = %+v, want %+v", res.Producible, wantProducible)
	}
}

func TestApplyErrors(t *testing.T) {
	tests := []struct {
		name string   // what goes wrong
		doc  string   // configuration
		md   Metadata // metadata
		want []string // parts of the error
	}{
		{
			name: "rendered label value invalid",
			doc:  "transformations:\n  - name: l\n    labels:\n      example.com/h: '{{ .InternalDNS }}/x'\n",
			md:   sample,
			want: []string{"test.yaml:4:", `transformations[0] "l"`, `labels["example.com/h"]`, `rendered "web-42-fra.internal/x", not a valid label value`},
		},
		{
			name: "rendered label value too long",
			doc:  "transformations:\n  - labels:\n      a: '{{ .Hostname }}'\n",
			md:   Metadata{Hostname: strings.Repeat("h", 64)},
			want: []string{"transformations[0]:", `labels["a"]`, "must be no more than 63"},
		},
		{
			name: "rendered taint value invalid",
			doc:  "transformations:\n  - name: t\n    taints:\n      - {key: a, value: '{{ .Zone }}', effect: NoSchedule}\n",
			md:   Metadata{Zone: "a b"},
			want: []string{`"t"`, "taints[0]", `rendered "a b", not a valid taint value`},
		},
		{
			name: "spot override not a boolean",
			doc:  "transformations:\n  - name: s\n    platformMetadata:\n      spot: '{{ .Zone }}'\n",
			md:   Metadata{Zone: "fra1"},
			want: []string{`"s"`, `platformMetadata["spot"]`, `spot must render to true or false, got "fra1"`},
		},
		{
			name: "rendered platform invalid",
			doc:  "transformations:\n  - name: p\n    platformMetadata:\n      platform: '{{ .Tags.cloud }}'\n",
			md:   Metadata{Platform: "nocloud"},
			want: []string{`"p"`, `platformMetadata["platform"]`, "platform must not be empty"},
		},
		{
			name: "annotations over the API server limit",
			doc:  "transformations:\n  - annotations:\n" + bigAnnotations(10),
			md:   Metadata{Hostname: strings.Repeat("h", 15<<10)},
			want: []string{"annotations:", "more than the API server's"},
		},
		{
			name: "later rule fails: no partial result",
			doc:  "transformations:\n  - labels: {a: b}\n  - name: bad\n    labels:\n      c: '{{ b64dec .Zone }}'\n",
			md:   Metadata{Zone: "!"},
			want: []string{`transformations[1] "bad"`, `labels["c"]`, "b64dec"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := mustParse(t, tt.doc).Apply(tt.md)
			if err == nil {
				t.Fatalf("Apply succeeded: %+v", res)
			}
			if res != nil {
				t.Errorf("Apply returned a result with its error: %+v", res)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error %T is not an *Error", err)
			}
			for _, part := range tt.want {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error\n  %v\ndoes not contain\n  %s", err, part)
				}
			}
		})
	}
}

func bigAnnotations(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("      example.com/a" + string(rune('a'+i)) + ": '{{ .Hostname }}{{ .Hostname }}'\n")
	}
	return b.String()
}

func TestPlatformOverride(t *testing.T) {
	// A nocloud image on OpenStack: route the node to the OpenStack CCM.
	c := mustParse(t, `
transformations:
  - name: nocloud-on-openstack
    nodeSelector:
      - matchExpressions:
          - {key: platform, operator: In, values: [nocloud]}
          - {key: tags.openstack-uuid, operator: Exists}
    platformMetadata:
      platform: openstack
      providerID: "openstack:///{{ index .Tags \"openstack-uuid\" }}"
  - name: openstack
    nodeSelector:
      - matchExpressions: [{key: platform, operator: In, values: [openstack]}]
    labels: {example.com/cloud: openstack}
`)
	res, err := c.Apply(Metadata{Platform: "nocloud", Tags: map[string]string{"openstack-uuid": "abc"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Metadata.Platform != "openstack" || res.Metadata.ProviderID != "openstack:///abc" || res.Labels["example.com/cloud"] != "openstack" {
		t.Errorf("result: %+v", res)
	}
}

// The providerID Talos reports is in its own platform's format: a rule that
// moves the node to another platform drops it unless some rule sets one.
func TestPlatformOverrideDropsForeignProviderID(t *testing.T) {
	openstack := Metadata{Platform: "openstack", InstanceID: "5f0c7e1a", ProviderID: "openstack:///5f0c7e1a", Zone: "rma1"}
	for _, tc := range []struct {
		name  string   // what the rules do
		rules string   // transformations
		md    Metadata // the node's metadata
		// platform and providerID after the rules
		platform, providerID string
	}{
		{
			name:     "platform changed, no providerID given: dropped",
			rules:    "  - platformMetadata: {platform: cloudscale}\n",
			md:       openstack,
			platform: "cloudscale", providerID: "",
		},
		{
			name:     "platform changed with a providerID in the same rule",
			rules:    "  - platformMetadata: {platform: cloudscale, providerID: 'cloudscale://{{ .InstanceID }}'}\n",
			md:       openstack,
			platform: "cloudscale", providerID: "cloudscale://5f0c7e1a",
		},
		{
			name:     "the same rule keeps the old providerID on purpose",
			rules:    "  - platformMetadata: {platform: cloudscale, providerID: '{{ .ProviderID }}'}\n",
			md:       openstack,
			platform: "cloudscale", providerID: "openstack:///5f0c7e1a",
		},
		{
			name: "a later rule sets the providerID",
			rules: "  - platformMetadata: {platform: cloudscale}\n" +
				"  - nodeSelector: [{matchExpressions: [{key: platform, operator: In, values: [cloudscale]}]}]\n" +
				"    platformMetadata: {providerID: 'cloudscale://{{ .InstanceID }}'}\n",
			md:       openstack,
			platform: "cloudscale", providerID: "cloudscale://5f0c7e1a",
		},
		{
			name:     "platform overridden with its own value: kept",
			rules:    "  - platformMetadata: {platform: openstack}\n",
			md:       openstack,
			platform: "openstack", providerID: "openstack:///5f0c7e1a",
		},
		{
			name:     "other fields overridden: kept",
			rules:    "  - platformMetadata: {zone: lpg1, instanceID: other}\n",
			md:       openstack,
			platform: "openstack", providerID: "openstack:///5f0c7e1a",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := mustParse(t, "transformations:\n"+tc.rules).Apply(tc.md)
			if err != nil {
				t.Fatal(err)
			}
			if res.Metadata.Platform != tc.platform || res.Metadata.ProviderID != tc.providerID {
				t.Errorf("platform %q providerID %q, want %q %q", res.Metadata.Platform, res.Metadata.ProviderID, tc.platform, tc.providerID)
			}
		})
	}
}

func TestZeroAndCodeBuiltConfig(t *testing.T) {
	var zero Config
	res, err := zero.Apply(sample)
	if err != nil || len(res.Matched) != 0 || len(res.Labels) != 0 || res.Metadata.Hostname != sample.Hostname {
		t.Errorf("zero Config: %+v, %v", res, err)
	}
	if zero.NeedsSystemInformation() {
		t.Error("zero Config needs SystemInformation")
	}
	// A Config built in code is compiled on use.
	built := &Config{Transformations: []Transformation{{
		Name:         "code",
		NodeSelector: []SelectorTerm{{MatchExpressions: []Expression{{Key: "platform", Operator: OpIn, Values: []string{"metal"}}}}},
		Labels:       map[string]string{"example.com/p": "{{ .Platform }}"},
		Taints:       []Taint{{Key: "t", Effect: "NoSchedule"}},
	}}}
	res, err = built.Apply(sample)
	if err != nil || res.Labels["example.com/p"] != "metal" || len(res.Taints) != 1 {
		t.Errorf("built Config: %+v, %v", res, err)
	}
	built.Transformations[0].Taints[0].Effect = "Sometimes"
	if _, err := built.Apply(sample); err == nil || !strings.Contains(err.Error(), `transformations[0] "code": taints[0].effect: invalid taint effect "Sometimes"`) {
		t.Errorf("invalid built Config: %v", err)
	}
	if !built.NeedsSystemInformation() {
		t.Error("an invalid Config must report that it needs SystemInformation (the safe answer)")
	}
}

func TestResultClone(t *testing.T) {
	res, err := mustParse(t, "transformations:\n  - labels: {a: b}\n    taints: {t: NoSchedule}\n").Apply(sample)
	if err != nil {
		t.Fatal(err)
	}
	c := res.Clone()
	c.Labels["a"] = "changed"
	c.Taints[0].Value = "changed"
	c.Metadata.Tags["env"] = "changed"
	if res.Labels["a"] != "b" || res.Taints[0].Value != "" || res.Metadata.Tags["env"] != "prod" {
		t.Errorf("Clone shares state: %+v", res)
	}
	if (*Result)(nil).Clone() != nil {
		t.Error("Clone of nil is not nil")
	}
}

func TestApplyConcurrently(t *testing.T) {
	// The cloud provider applies one Config to many nodes at once.
	c, err := Load("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	for i := range 8 {
		go func() {
			md := sample.clone()
			md.Hostname = "web-r" + strings.Repeat("1", i+1) + "-x"
			var err error
			for range 50 {
				if _, err = c.Apply(md); err != nil {
					break
				}
			}
			done <- err
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
