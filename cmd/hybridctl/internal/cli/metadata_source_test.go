package cli

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
)

func TestParseMetadata(t *testing.T) {
	tests := []struct {
		name     string             // case
		doc      string             // file content
		want     transform.Metadata // parsed metadata
		warnings []string           // parts of the warnings, in order
		err      string             // part of the error; "" for none
	}{
		{
			name: "plain PlatformMetadata keys",
			doc:  "platform: aws\nhostname: ip-1\nregion: us-east-1\nzone: us-east-1a\ninstanceType: m5.large\ninstanceId: i-1\nproviderId: aws:///us-east-1a/i-1\nspot: true\ninternalDNS: ip-1.ec2.internal\nexternalDNS: ec2-1.compute.amazonaws.com\ntags: {team: infra}\n",
			want: transform.Metadata{Platform: "aws", Hostname: "ip-1", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "m5.large", InstanceID: "i-1", ProviderID: "aws:///us-east-1a/i-1", Spot: true, InternalDNS: "ip-1.ec2.internal", ExternalDNS: "ec2-1.compute.amazonaws.com", Tags: map[string]string{"team": "infra"}},
		},
		{
			name: "values keep their text",
			doc:  "instanceId: 0042\nzone: 1e3\nhostname: ~\n",
			want: transform.Metadata{InstanceID: "0042", Zone: "1e3"},
		},
		{
			name: "talosctl resource",
			doc:  "node: 10.0.0.1\nmetadata: {namespace: runtime, type: PlatformMetadatas.talos.dev, id: platformmetadata}\nspec: {platform: hcloud, instanceId: '123'}\n",
			want: transform.Metadata{Platform: "hcloud", InstanceID: "123"},
		},
		{
			name: "resource without a type is PlatformMetadata",
			doc:  "spec: {platform: gcp}\n",
			want: transform.Metadata{Platform: "gcp"},
		},
		{
			name: "PlatformMetadata and SystemInformation documents",
			doc:  "spec: {platform: metal}\n---\nmetadata: {type: SystemInformations.hardware.talos.dev}\nspec: {manufacturer: Dell, serialnumber: X1, wakeUpType: Power Switch}\n",
			want: transform.Metadata{Platform: "metal", Manufacturer: "Dell", SerialNumber: "X1"},
		},
		{
			name:     "unknown keys are warnings",
			doc:      "platform: metal\ncolour: red\ntags.team: x\nnested: {a: b}\n",
			want:     transform.Metadata{Platform: "metal"},
			warnings: []string{`line 2: unknown key "colour" ignored`, `line 3: unknown key "tags.team" ignored (write tags as a mapping)`, `line 4: key "nested" ignored`},
		},
		{name: "two nodes", doc: "spec: {platform: a}\n---\nspec: {platform: b}\n", err: "line 3: a second PlatformMetadata document (the first is on line 1)"},
		{name: "other resource", doc: "metadata: {type: Members.cluster.talos.dev}\nspec: {}\n", err: `resource type "Members.cluster.talos.dev"`},
		{name: "spot not a boolean", doc: "spot: perhaps\n", err: "line 1: spot must render to true or false"},
		{name: "tags not a mapping", doc: "tags: [a]\n", err: "tags must be a mapping"},
		{name: "tag not a string", doc: "tags: {a: [b]}\n", err: `tag "a" must be a string`},
		{name: "empty file", doc: "", err: "no metadata"},
		{name: "not a mapping", doc: "- a\n", err: "must be a mapping"},
		{name: "spec not a mapping", doc: "spec: x\n", err: "spec must be a mapping"},
		{name: "YAML syntax", doc: "a: [\n", err: "yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md, warnings, err := ParseMetadata([]byte(tt.doc))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(md, tt.want) {
				t.Errorf("metadata = %+v, want %+v", md, tt.want)
			}
			if len(warnings) != len(tt.warnings) {
				t.Fatalf("warnings = %q, want %q", warnings, tt.warnings)
			}
			for i, w := range tt.warnings {
				if !strings.Contains(warnings[i], w) {
					t.Errorf("warning %d = %q, want %q", i, warnings[i], w)
				}
			}
		})
	}
}
