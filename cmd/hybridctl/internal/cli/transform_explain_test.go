package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// run executes hybridctl with args and returns stdout, stderr and the error.
func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := NewRootCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return stdout.String(), stderr.String(), err
}

// writeFile writes content to a file in a temporary directory.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExplainText(t *testing.T) {
	tests := []struct {
		name     string   // case
		metadata string   // metadata file content ("" → testdata/web-1.talosctl.yaml)
		want     []string // lines (trimmed) stdout must contain
		notWant  []string // parts stdout must not contain
	}{
		{
			name: "talosctl output with SystemInformation",
			want: []string{
				"Config:  testdata/rules.yaml (3 rules)",
				"[0] web-nodes   matched (nodeSelector[0])",
				"[1] supermicro  matched (nodeSelector[0])",
				"[2] spot        no match",
				`nodeSelector[0].matchExpressions[0]: spot "false" is not in ["true"]`,
				`region        fra-on-metal  (was "fra")`,
				"manufacturer  Supermicro",
				"tags.rack     r7",
				`node-role.kubernetes.io/web=""`,
				`example.com/serial: "S123"`,
				"dedicated=web:NoSchedule",
				"publicIPDiscovery: true",
			},
			notWant: []string{"example.com/capacity"},
		},
		{
			name:     "plain fields",
			metadata: "platform: metal\nhostname: db-1\nspot: true\n",
			want: []string{
				"[0] web-nodes   no match",
				`nodeSelector[0].matchExpressions[1]: hostname "db-1" matches none of ["^web-"]`,
				"[1] supermicro  no match",
				"nodeSelector[0].matchExpressions[0]: manufacturer is absent",
				"[2] spot        matched (nodeSelector[0])",
				`example.com/capacity="spot"`,
				"Annotations\n  (none)",
				"Taints\n  (none)",
				"publicIPDiscovery: false",
			},
		},
		{
			name:     "JSON metadata, keys in any case",
			metadata: `{"Platform": "metal", "HOSTNAME": "web-2", "instanceID": "7"}`,
			want:     []string{"[0] web-nodes   matched", "instanceID  7"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md := "testdata/web-1.talosctl.yaml"
			if tt.metadata != "" {
				md = writeFile(t, "node.yaml", tt.metadata)
			}
			out, stderr, err := run(t, "transform", "explain", "--config", "testdata/rules.yaml", "--metadata", md)
			if err != nil {
				t.Fatalf("explain: %v\n%s", err, stderr)
			}
			assertOutput(t, out, tt.want, tt.notWant)
		})
	}
}

func TestExplainStructuredOutput(t *testing.T) {
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			out, _, err := run(t, "transform", "explain", "-c", "testdata/rules.yaml", "-m", "testdata/web-1.talosctl.yaml", "--node-ip", "10.0.0.5", "-o", format)
			if err != nil {
				t.Fatal(err)
			}
			var r struct {
				Config string
				Rules  []struct {
					Name      string
					Matched   bool
					Term      int
					Misses    []string
					Evaluated bool
				}
				Input           map[string]any
				Metadata        map[string]any
				Labels          map[string]string
				RuleLabels      map[string]string
				ProviderID      string
				ProviderIDRetry string
				Taints          []corev1.Taint
				Features        map[string]bool
			}
			if format == "json" {
				err = json.Unmarshal([]byte(out), &r)
			} else {
				err = yaml.Unmarshal([]byte(out), &r)
			}
			if err != nil {
				t.Fatalf("output is not %s: %v\n%s", format, err, out)
			}
			if r.Config != "testdata/rules.yaml" || len(r.Rules) != 3 || !r.Rules[0].Matched || r.Rules[2].Matched || len(r.Rules[2].Misses) != 1 || !r.Rules[2].Evaluated {
				t.Errorf("rules: %+v", r.Rules)
			}
			if r.Metadata["region"] != "fra-on-metal" || r.Input["region"] != "fra" || r.Metadata["serialNumber"] != "S123" {
				t.Errorf("metadata %v, input %v", r.Metadata, r.Input)
			}
			wantLabels := map[string]string{
				"node-role.kubernetes.io/web":                  "",
				names.PlatformLabel:                            "metal",
				"node.cloudprovider.kubernetes.io/clustername": "demo",
				"topology.kubernetes.io/region":                "fra-on-metal",
				"failure-domain.beta.kubernetes.io/region":     "fra-on-metal",
			}
			if !reflect.DeepEqual(r.Labels, wantLabels) {
				t.Errorf("labels:\n got %v\nwant %v", r.Labels, wantLabels)
			}
			if !reflect.DeepEqual(r.RuleLabels, map[string]string{"node-role.kubernetes.io/web": ""}) {
				t.Errorf("ruleLabels: %v", r.RuleLabels)
			}
			if r.ProviderID != "talos://metal/10.0.0.5" || r.ProviderIDRetry != "" {
				t.Errorf("providerID %q (retry %q)", r.ProviderID, r.ProviderIDRetry)
			}
			if want := []corev1.Taint{{Key: "dedicated", Value: "web", Effect: corev1.TaintEffectNoSchedule}}; !reflect.DeepEqual(r.Taints, want) {
				t.Errorf("taints: %+v", r.Taints)
			}
			if !r.Features["publicIPDiscovery"] {
				t.Errorf("features: %v", r.Features)
			}
		})
	}
}

func TestExplainErrors(t *testing.T) {
	tests := []struct {
		name       string   // case
		args       []string // after "transform explain"
		wantErr    []string // parts of the returned error
		wantStdout []string // parts of stdout (a partial report), if any
		wantStderr []string // parts of stderr
	}{
		{
			name:    "invalid rules file names file, line, rule and field",
			args:    []string{"-c", "testdata/bad-rules.yaml", "-m", "testdata/web-1.talosctl.yaml"},
			wantErr: []string{"testdata/bad-rules.yaml:5:", `transformations[0] "web-nodes"`, "nodeSelector[0].matchExpressions[0].values[0]", `invalid regexp "("`},
		},
		{
			name:       "a rule that fails for this node",
			args:       []string{"-c", "testdata/failing-rules.yaml", "-m", "testdata/web-1.talosctl.yaml"},
			wantErr:    []string{"the rules fail for this node", `transformations[1] "hostname-label"`, `labels["example.com/fqdn"]`, "not a valid label value"},
			wantStdout: []string{"[0] ok              matched", "[1] hostname-label  matched", "[2] after           not evaluated", "Error"},
		},
		{
			name:    "missing rules file",
			args:    []string{"-c", "testdata/nope.yaml", "-m", "testdata/web-1.talosctl.yaml"},
			wantErr: []string{"testdata/nope.yaml", "no such file"},
		},
		{name: "no --config", args: []string{"-m", "testdata/web-1.talosctl.yaml"}, wantErr: []string{`"config" not set`}},
		{name: "no metadata", args: []string{"-c", "testdata/rules.yaml"}, wantErr: []string{"--metadata is required"}},
		{name: "--node-ip with --node", args: []string{"-c", "testdata/rules.yaml", "--node", "10.0.0.5", "--node-ip", "10.0.0.6"}, wantErr: []string{"--node-ip is for --metadata"}},
		{name: "--node-ip not an address", args: []string{"-c", "testdata/rules.yaml", "-m", "testdata/web-1.talosctl.yaml", "--node-ip", "web-1"}, wantErr: []string{`--node-ip "web-1": not an IP address`}},
		{name: "both sources", args: []string{"-c", "testdata/rules.yaml", "-m", "x", "--node", "10.0.0.5"}, wantErr: []string{"either --metadata or --node"}},
		{name: "live mode without talosconfig", args: []string{"-c", "testdata/rules.yaml", "--node", "10.0.0.5", "--talosconfig", "testdata/no-talosconfig"}, wantErr: []string{"--node 10.0.0.5", "testdata/no-talosconfig"}},
		{name: "bad output format", args: []string{"-c", "testdata/rules.yaml", "-m", "x", "-o", "xml"}, wantErr: []string{`--output "xml"`}},
		{name: "missing metadata file", args: []string{"-c", "testdata/rules.yaml", "-m", "testdata/nope.yaml"}, wantErr: []string{"testdata/nope.yaml"}},
		{name: "extra argument", args: []string{"-c", "testdata/rules.yaml", "-m", "x", "extra"}, wantErr: []string{"unknown command"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, err := run(t, append([]string{"transform", "explain"}, tt.args...)...)
			if err == nil {
				t.Fatalf("explain succeeded:\n%s", out)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n  %v\ndoes not contain\n  %s", err, w)
				}
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(out, w) {
					t.Errorf("stdout does not contain %q:\n%s", w, out)
				}
			}
			if len(tt.wantStdout) == 0 && out != "" {
				t.Errorf("stdout should be empty on this error:\n%s", out)
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not contain %q:\n%s", w, stderr)
				}
			}
		})
	}
}

func TestExplainWarnsAboutUnknownKeys(t *testing.T) {
	md := writeFile(t, "node.yaml", "platform: metal\nhostname: web-1\nzoen: fra1\n")
	_, stderr, err := run(t, "transform", "explain", "-c", "testdata/rules.yaml", "-m", md)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, `warning: `+md+`: line 3: unknown key "zoen" ignored`) {
		t.Errorf("stderr = %q", stderr)
	}
}

// explain shows what talos-ccm writes on the Node besides rule output: the
// providerID (native format, Azure resource group lower-cased, talos://
// fallback, or none and a retry) and the labels talos-ccm sets itself.
func TestExplainShowsWhatTalosCCMWrites(t *testing.T) {
	rules := writeFile(t, "rules.yaml", `global:
  clusterName: prod
transformations:
  - name: gpu
    nodeSelector:
      - matchExpressions:
          - {key: instanceType, operator: Regexp, values: ["^g"]}
    labels:
      example.com/gpu: "true"
    platformMetadata:
      zone: "{{ .Zone }}-gpu"
`)
	lines := func(kv ...string) []string { return kv }
	tests := []struct {
		name     string
		metadata string
		args     []string
		want     []string // lines stdout must contain
		notWant  []string
	}{
		{
			name:     "aws spot: providerID from zone and instance ID, every derived label",
			metadata: "platform: aws\nhostname: ip-10-0-0-1\nregion: us-east-1\nzone: us-east-1a\ninstanceType: g5.xlarge\ninstanceId: i-0abc\nspot: true\n",
			want: lines("ProviderID\n  aws:///us-east-1a-gpu/i-0abc\n",
				`example.com/gpu="true"`,
				`node.cloudprovider.kubernetes.io/platform="aws"`,
				`node.cloudprovider.kubernetes.io/clustername="prod"`,
				`node.cloudprovider.kubernetes.io/lifecycle="spot"`,
				`topology.kubernetes.io/region="us-east-1"`,
				`failure-domain.beta.kubernetes.io/region="us-east-1"`,
				`topology.kubernetes.io/zone="us-east-1a-gpu"`,
				`failure-domain.beta.kubernetes.io/zone="us-east-1a-gpu"`,
				`node.kubernetes.io/instance-type="g5.xlarge"`,
				`beta.kubernetes.io/instance-type="g5.xlarge"`),
		},
		{
			name:     "azure: resource group lower-cased",
			metadata: "platform: azure\nhostname: vm1\nproviderId: azure:///subscriptions/S/resourceGroups/My-RG/providers/Microsoft.Compute/virtualMachines/VM1\n",
			want: lines("ProviderID\n  azure:///subscriptions/S/resourceGroups/my-rg/providers/Microsoft.Compute/virtualMachines/VM1\n",
				`node.cloudprovider.kubernetes.io/platform="azure"`),
			notWant: lines("lifecycle", "topology.kubernetes.io", "instance-type", "example.com/gpu"),
		},
		{
			name:     "metal: talos:// fallback with --node-ip",
			metadata: "platform: metal\nhostname: web-1\n",
			args:     lines("--node-ip", "192.0.2.7"),
			want:     lines("ProviderID\n  talos://metal/192.0.2.7\n", `node.cloudprovider.kubernetes.io/platform="metal"`),
		},
		{
			name:     "metal without --node-ip says what is missing",
			metadata: "platform: metal\nhostname: web-1\n",
			want:     lines("ProviderID\n  talos://metal/<node-ip>  (the node's IP: give --node-ip)\n"),
		},
		{
			name:     "hcloud without instance ID: no providerID, retried",
			metadata: "platform: hcloud\nhostname: cx-1\nregion: fsn1\n",
			args:     lines("--node-ip", "192.0.2.8"),
			want: lines("ProviderID\n  none yet: talos-ccm leaves the node uninitialized and retries (",
				`platform "hcloud" has a native providerID format but metadata has no providerID/instanceID yet`),
			notWant: lines("talos://"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md := writeFile(t, "node.yaml", tt.metadata)
			out, stderr, err := run(t, append([]string{"transform", "explain", "-c", rules, "-m", md}, tt.args...)...)
			if err != nil {
				t.Fatalf("explain: %v\n%s", err, stderr)
			}
			assertOutput(t, out, tt.want, tt.notWant)
		})
	}
}

// assertOutput checks that out contains every want and no notWant.
func assertOutput(t *testing.T, out string, want, notWant []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output does not contain %q:\n%s", w, out)
		}
	}
	for _, w := range notWant {
		if strings.Contains(out, w) {
			t.Errorf("output contains %q:\n%s", w, out)
		}
	}
}
