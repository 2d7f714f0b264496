package fleet

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var cloudMachines = []Machine{
	{Name: "metal-1", Platform: "metal"},
	{Name: "aws-1", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0a1", Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "m5.large"},
	{Name: "aws-2", Platform: "aws", ProviderID: "aws:///eu-west-1b/i-0a2", Region: "eu-west-1", Zone: "eu-west-1b"},
	{Name: "hcloud-1", Platform: "hcloud", InstanceID: "1001"},
	{Name: "hcloud-2", Platform: "hcloud", InstanceID: "1002"},
	{Name: "gcp-1", Platform: "gcp", ProviderID: "gce://p/z/gcp-1"},
}

func startTestClouds(t *testing.T) *Clouds {
	t.Helper()
	ips := map[string]string{}
	for i, m := range cloudMachines {
		ips[m.Name] = fmt.Sprintf("10.99.0.%d", 11+i)
	}
	c, err := newClouds(cloudMachines, ips, CloudOptions{AWSClusterID: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.serve("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// instance asks the test/testccm API as the CCM of provider does.
func instance(t *testing.T, c *Clouds, provider, node string) (exists, shutdown bool) {
	t.Helper()
	resp, err := http.Get(c.TestCCMURL() + "/?" + url.Values{"provider": {provider}, "node": {node}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct{ Exists, Shutdown bool }
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	return got.Exists, got.Shutdown
}

// TestCloudsKnowOwnMachines: each test/testccm cloud knows exactly its own
// platform's machines; Terminate and Stop change what it says; every
// question is recorded, a question about another platform's machine
// marked foreign.
func TestCloudsKnowOwnMachines(t *testing.T) {
	c := startTestClouds(t)
	for _, tc := range []struct {
		provider, node   string
		exists, shutdown bool
	}{
		{"hcloud", "hcloud-1", true, false},
		{"hcloud", "aws-1", false, false},
		{"hcloud", "metal-1", false, false},
		{"gce", "gcp-1", true, false},
		{"gce", "hcloud-2", false, false},
		{"nosuchcloud", "hcloud-1", false, false},
	} {
		if e, s := instance(t, c, tc.provider, tc.node); e != tc.exists || s != tc.shutdown {
			t.Errorf("%s asked about %s: exists %v shutdown %v, want %v %v", tc.provider, tc.node, e, s, tc.exists, tc.shutdown)
		}
	}
	if err := c.Terminate("hcloud-1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop("hcloud-2"); err != nil {
		t.Fatal(err)
	}
	if e, _ := instance(t, c, "hcloud", "hcloud-1"); e {
		t.Error("a terminated hcloud server still exists")
	}
	if e, s := instance(t, c, "hcloud", "hcloud-2"); !e || !s {
		t.Errorf("a stopped hcloud server: exists %v shutdown %v, want both", e, s)
	}
	if err := c.Terminate("nope"); err == nil {
		t.Error("Terminate of an unknown machine did not fail")
	}
	foreign := map[string]bool{}
	for _, q := range c.Questions() {
		if q.Foreign {
			foreign[q.Provider+"/"+q.About] = true
		}
	}
	// (a cloud no profile names knows no machine)
	for _, want := range []string{"hcloud/aws-1", "hcloud/metal-1", "gce/hcloud-2", "nosuchcloud/hcloud-1"} {
		if !foreign[want] {
			t.Errorf("question %s not marked foreign: %v", want, c.Questions())
		}
	}
	if len(foreign) != 4 {
		t.Errorf("foreign questions %v, want 4", foreign)
	}
	if n := c.Asked("hcloud", "hcloud-1"); n != 2 {
		t.Errorf("hcloud asked about hcloud-1 %d times, want 2", n)
	}
}

// TestCloudsEC2 asks the fake EC2 as the AWS CCM does: by instance ID and
// by private DNS name; the questions name the nodes, and a terminated
// instance says so.
func TestCloudsEC2(t *testing.T) {
	c := startTestClouds(t)
	if got := c.AWSRegion(); got != "eu-west-1" {
		t.Errorf("region %q, want the first aws machine's", got)
	}
	conf := c.AWSCloudConf()
	for _, want := range []string{"Region = eu-west-1", "KubernetesClusterID = test", "VPC = " + AWSVPC, "SubnetID = " + AWSSubnet,
		"URL = " + c.EC2URL() + "/ec2", "Service = Elastic Load Balancing\n"} {
		if !strings.Contains(conf, want) {
			t.Errorf("cloud.conf lacks %q:\n%s", want, conf)
		}
	}
	describe := func(form url.Values) string { return describeInstances(t, c.EC2URL(), form) }
	if err := c.Terminate("aws-1"); err != nil {
		t.Fatal(err)
	}
	if out := describe(url.Values{"InstanceId.1": {"i-0a1"}}); !strings.Contains(out, fakeec2.Terminated) {
		t.Errorf("terminated instance: %s", out)
	}
	if out := describe(url.Values{"Filter.1.Name": {"private-dns-name"}, "Filter.1.Value.1": {"ip-10-99-0-13.eu-west-1.compute.internal"}}); !strings.Contains(out, "i-0a2") {
		t.Errorf("instance by private DNS name: %s", out)
	}
	got := map[string]int{}
	for _, q := range c.Questions() {
		got[q.Provider+"/"+q.About] = q.Times
		if q.Foreign {
			t.Errorf("foreign question %+v", q)
		}
	}
	if got["aws/aws-1"] != 1 || got["aws/aws-2"] != 1 {
		t.Errorf("questions %v, want aws/aws-1 and aws/aws-2 once", got)
	}
}

// describeInstances asks EC2 at base (unsigned) what the AWS CCM asks.
func describeInstances(t *testing.T, base string, form url.Values) string {
	t.Helper()
	form.Set("Action", "DescribeInstances")
	form.Set("Version", "2016-11-15")
	resp, err := http.PostForm(base+"/ec2", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCloudsEC2Regions: aws machines of two regions are instances of their
// own region; each region has its endpoint, which finds only that region's
// instances, and a cloud.conf pointing at it with that region's network.
// The default region's cloud.conf is unchanged.
func TestCloudsEC2Regions(t *testing.T) {
	machines := []Machine{
		{Name: "aws-eu", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0e1", Region: "eu-west-1", Zone: "eu-west-1a"},
		{Name: "aws-us", Platform: "aws", ProviderID: "aws:///us-east-1a/i-0u1", Zone: "us-east-1a"},
	}
	c, err := newClouds(machines, map[string]string{"aws-eu": "10.99.0.11", "aws-us": "10.99.0.12"}, CloudOptions{AWSClusterID: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.serve("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if got := c.AWSRegions(); !slices.Equal(got, []string{"eu-west-1", "us-east-1"}) {
		t.Fatalf("regions %v", got)
	}
	if !strings.Contains(c.AWSCloudConf(), "URL = "+c.EC2URL()+"/ec2") {
		t.Errorf("the default cloud.conf does not point at the region-less endpoint:\n%s", c.AWSCloudConf())
	}
	for _, tc := range []struct{ region, mine, other, vpc, subnet string }{
		{"eu-west-1", "i-0e1", "i-0u1", AWSVPC, AWSSubnet},
		{"us-east-1", "i-0u1", "i-0e1", AWSVPC + "-us-east-1", AWSSubnet + "-us-east-1"},
	} {
		url := c.AWSRegionURL(tc.region)
		conf, err := c.AWSRegionCloudConf(tc.region)
		if err != nil || url == "" || url == c.EC2URL() {
			t.Fatalf("region %s: endpoint %q, cloud.conf %v", tc.region, url, err)
		}
		for _, want := range []string{"Region = " + tc.region + "\n", "VPC = " + tc.vpc + "\n", "SubnetID = " + tc.subnet + "\n",
			"URL = " + url + "/ec2\n", "SigningRegion = " + tc.region + "\n"} {
			if !strings.Contains(conf, want) {
				t.Errorf("region %s: cloud.conf lacks %q:\n%s", tc.region, want, conf)
			}
		}
		if out := describeInstances(t, url, map[string][]string{"InstanceId.1": {tc.mine}}); !strings.Contains(out, tc.mine) {
			t.Errorf("region %s does not find its instance %s: %s", tc.region, tc.mine, out)
		}
		if out := describeInstances(t, url, map[string][]string{"InstanceId.1": {tc.other}}); !strings.Contains(out, "InvalidInstanceID.NotFound") {
			t.Errorf("region %s finds %s of the other region: %s", tc.region, tc.other, out)
		}
	}
	if _, err := c.AWSRegionCloudConf("ap-south-1"); err == nil {
		t.Error("a cloud.conf for a region without machines")
	}
	for _, call := range c.EC2.Calls() {
		if want := map[string]string{"i-0e1": "eu-west-1", "i-0u1": "us-east-1"}; len(call.InstanceIDs) != 1 || call.Region == "" {
			t.Errorf("call %s", call)
		} else if call.Error == "" && call.Region != want[call.InstanceIDs[0]] {
			t.Errorf("call %s answered at %s", call, call.Region)
		}
	}
}

// TestDecodeManifests reads the static manifests of docs/deploy.
func TestDecodeManifests(t *testing.T) {
	for _, file := range []string{"talos-ccm.yaml", "ccm-coordinator.yaml"} {
		data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "deploy", file))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := DecodeManifests(data)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		kinds := map[string]int{}
		for _, o := range objs {
			kinds[o.GetKind()]++
		}
		if kinds["Deployment"] != 1 || len(objs) < 5 {
			t.Errorf("%s: %d objects %v, want one Deployment among them", file, len(objs), kinds)
		}
	}
	if _, err := DecodeManifests([]byte("---\nfoo: bar\n")); err == nil {
		t.Error("a document without kind was accepted")
	}
}
