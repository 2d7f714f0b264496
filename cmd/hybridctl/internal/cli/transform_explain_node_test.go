package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// --node reads a live node through the real Talos API (simulated node, real
// protocol, mTLS) and explains it like a metadata file.
func TestExplainLiveNode(t *testing.T) {
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Stop()
	if _, err := ep.AddNode("web-7", []string{"10.70.0.7"}, talosnode.Spec{
		Metadata: &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "web-7", Region: "dc1"},
		System:   &hardware.SystemInformationSpec{Manufacturer: "Supermicro"},
	}); err != nil {
		t.Fatal(err)
	}
	tc := filepath.Join(t.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(tc, "os:reader"); err != nil {
		t.Fatal(err)
	}
	rules := writeFile(t, "rules.yaml", `transformations:
  - name: web-nodes
    nodeSelector:
      - matchExpressions:
          - key: hostname
            operator: Regexp
            values: ['^web-']
          - key: manufacturer
            operator: In
            values: [Supermicro]
    labels:
      node-role.kubernetes.io/web: ""
`)
	out, stderr, err := run(t, "transform", "explain", "-c", rules, "--node", "10.70.0.7", "--talosconfig", tc)
	if err != nil {
		t.Fatalf("explain --node: %v\n%s", err, stderr)
	}
	for _, want := range []string{"web-nodes", "matched", `node-role.kubernetes.io/web=""`,
		"ProviderID\n  talos://metal/10.70.0.7\n", `node.cloudprovider.kubernetes.io/platform="metal"`, `topology.kubernetes.io/region="dc1"`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "clustername") {
		t.Errorf("a talosconfig context without a cluster gives no clustername label:\n%s", out)
	}
	// an address no node answers on is a clear error naming it
	if _, _, err := run(t, "transform", "explain", "-c", rules, "--node", "10.70.0.99", "--talosconfig", tc); err == nil || !strings.Contains(err.Error(), "10.70.0.99") {
		t.Fatalf("unknown node: want error naming it, got %v", err)
	}
}

// --node finds the talosconfig as talos-ccm does ($TALOSCONFIG when no
// --talosconfig), and --talos-endpoints overrides the talosconfig's endpoints,
// as the file's global.endpoints does when the flag is not given.
func TestExplainLiveNodeTalosconfigLookup(t *testing.T) {
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Stop()
	if _, err := ep.AddNode("db-3", []string{"10.71.0.3"}, talosnode.Spec{
		Metadata: &runtime.PlatformMetadataSpec{Platform: "nocloud", Hostname: "db-3"},
	}); err != nil {
		t.Fatal(err)
	}
	tc := filepath.Join(t.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(tc, "os:reader", "127.0.0.1:1"); err != nil { // nothing listens there
		t.Fatal(err)
	}
	t.Setenv("TALOSCONFIG", tc)
	t.Setenv("HOME", t.TempDir())
	rules := writeFile(t, "rules.yaml", "transformations: []\n")

	// the flag default is read when the command is built, as in hybridctl
	if _, _, err := run(t, "transform", "explain", "-c", rules, "--node", "10.71.0.3"); err == nil {
		t.Fatal("the talosconfig's dead endpoint answered")
	}
	if ep.Requests() != 0 {
		t.Fatalf("endpoint saw %d requests without the override", ep.Requests())
	}
	out, stderr, err := run(t, "transform", "explain", "-c", rules, "--node", "10.71.0.3", "--talos-endpoints", ep.Addr())
	if err != nil {
		t.Fatalf("explain --talos-endpoints: %v\n%s", err, stderr)
	}
	if !strings.Contains(out, "talos://nocloud/10.71.0.3") || ep.Requests() == 0 {
		t.Fatalf("output (endpoint saw %d requests):\n%s", ep.Requests(), out)
	}

	// the upstream Talos CCM's global.endpoints in the file: used as talos-ccm
	// uses it, instead of the talosconfig's; --talos-endpoints wins over it
	withEndpoints := writeFile(t, "upstream.yaml", "global:\n  endpoints: ["+ep.Addr()+"]\ntransformations: []\n")
	before := ep.Requests()
	out, stderr, err = run(t, "transform", "explain", "-c", withEndpoints, "--node", "10.71.0.3")
	if err != nil || !strings.Contains(out, "talos://nocloud/10.71.0.3") || ep.Requests() == before {
		t.Fatalf("explain with global.endpoints: %v\n%s\n%s", err, stderr, out)
	}
	if _, _, err := run(t, "transform", "explain", "-c", withEndpoints, "--node", "10.71.0.3", "--talos-endpoints", "127.0.0.1:1"); err == nil {
		t.Fatal("--talos-endpoints did not win over global.endpoints")
	}
}

// --node explains as talos-ccm initializes: without global.clusterName the
// cluster of the talosconfig context is the clustername label, and a node
// whose metadata has no hostname is matched by its node name.
func TestExplainLiveNodeAsTalosCCM(t *testing.T) {
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Stop()
	if _, err := ep.AddNode("web-8", []string{"10.72.0.8"}, talosnode.Spec{
		Metadata: &runtime.PlatformMetadataSpec{Platform: "metal"},
	}); err != nil {
		t.Fatal(err)
	}
	cfg, err := ep.ClientConfig("os:reader")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts[cfg.Context].Cluster = "prod-eu"
	tc := filepath.Join(t.TempDir(), "talosconfig")
	if err := cfg.Save(tc); err != nil {
		t.Fatal(err)
	}
	rules := writeFile(t, "rules.yaml", `transformations:
  - name: web-nodes
    nodeSelector:
      - matchExpressions:
          - {key: hostname, operator: Regexp, values: ['^web-']}
    labels:
      node-role.kubernetes.io/web: ""
`)
	out, stderr, err := run(t, "transform", "explain", "-c", rules, "--node", "10.72.0.8", "--talosconfig", tc)
	if err != nil {
		t.Fatalf("explain --node: %v\n%s", err, stderr)
	}
	for _, want := range []string{"[0] web-nodes  matched", `node.cloudprovider.kubernetes.io/clustername="prod-eu"`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr, `using the node name "web-8"`) {
		t.Errorf("no warning about the node name standing in for the hostname: %q", stderr)
	}
	// global.clusterName wins over the talosconfig
	rules = writeFile(t, "rules.yaml", "global:\n  clusterName: from-config\n")
	out, _, err = run(t, "transform", "explain", "-c", rules, "--node", "10.72.0.8", "--talosconfig", tc)
	if err != nil || !strings.Contains(out, `node.cloudprovider.kubernetes.io/clustername="from-config"`) {
		t.Fatalf("global.clusterName: %v\n%s", err, out)
	}
}

// A metadata file without hostname: talos-ccm would use the node name, which a
// file does not give; explain says so.
func TestExplainFileWithoutHostnameWarns(t *testing.T) {
	md := writeFile(t, "node.yaml", "platform: metal\n")
	rules := writeFile(t, "rules.yaml", "transformations: []\n")
	_, stderr, err := run(t, "transform", "explain", "-c", rules, "-m", md)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "no hostname: talos-ccm matches and renders the node name in its place") {
		t.Errorf("stderr %q lacks the warning", stderr)
	}
}
