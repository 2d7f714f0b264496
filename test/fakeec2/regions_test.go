package fakeec2_test

import (
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
)

func TestRegionOf(t *testing.T) {
	// zone, then its region
	for _, c := range [][2]string{{"eu-west-1a", "eu-west-1"}, {"us-east-1f", "us-east-1"}, {"ap-southeast-2b", "ap-southeast-2"},
		{"us-gov-west-1a", "us-gov-west-1"}, {"us-west-2-lax-1a", "us-west-2"}, {"", ""}} {
		if got := fakeec2.RegionOf(c[0]); got != c[1] {
			t.Errorf("RegionOf(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}

// regionalFake has an instance and a subnet in each of eu-west-1 and
// us-east-1, and an instance placed by its Region field alone.
func regionalFake() *fakeec2.Server {
	s := fakeec2.New(
		fakeec2.Instance{ID: "i-0eu", State: fakeec2.Running, Zone: "eu-west-1a"},
		fakeec2.Instance{ID: "i-0us", State: fakeec2.Running, Zone: "us-east-1b"},
		fakeec2.Instance{ID: "i-0usregion", State: fakeec2.Stopped, Region: "us-east-1"},
	)
	s.PutSubnet(fakeec2.Subnet{ID: "subnet-0eu", VPC: vpc, Zone: "eu-west-1a", CIDR: "10.0.0.0/24"})
	s.PutSubnet(fakeec2.Subnet{ID: "subnet-0us", VPC: vpc, Zone: "us-east-1b", CIDR: "10.0.1.0/24"})
	return s
}

// TestRegionEndpoints: each region's endpoint answers for its region only,
// as EC2's do: another region's instance is unknown there (by ID an
// InvalidInstanceID.NotFound naming just it; by filter or in a listing
// absent), and so are its subnets and zones; a request signed for another
// region is refused. The call log names the region each call was sent to.
func TestRegionEndpoints(t *testing.T) {
	s := regionalFake()
	eu := httptest.NewServer(s.Region("eu-west-1"))
	defer eu.Close()
	us := httptest.NewServer(s.Region("us-east-1"))
	defer us.Close()

	runAt(t, eu.URL, "eu-west-1", []step{
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0eu", contains: []string{"<instanceId>i-0eu</instanceId>"}},
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0us", code: "InvalidInstanceID.NotFound",
			contains: []string{"&#39;i-0us&#39;"}},
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0eu&InstanceId.2=i-0us", code: "InvalidInstanceID.NotFound",
			contains: []string{"&#39;i-0us&#39;"}, lacks: []string{"i-0eu"}},
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0usregion", code: "InvalidInstanceID.NotFound"},
		{service: "ec2", action: "DescribeInstances", form: "Filter.1.Name=instance-id&Filter.1.Value.1=i-0us",
			contains: []string{"<DescribeInstancesResponse"}, lacks: []string{"<instanceId>"}},
		{service: "ec2", action: "DescribeInstances", contains: []string{"<instanceId>i-0eu</instanceId>"}, lacks: []string{"i-0us"}},
		{service: "ec2", action: "DescribeSubnets", contains: []string{"subnet-0eu"}, lacks: []string{"subnet-0us"}},
		{service: "ec2", action: "DescribeSubnets", form: "SubnetId.1=subnet-0us", code: "InvalidSubnetID.NotFound"},
		{service: "ec2", action: "DescribeAvailabilityZones", contains: []string{"<zoneName>eu-west-1a</zoneName>", "<regionName>eu-west-1</regionName>"},
			lacks: []string{"us-east-1"}},
		{service: "ec2", action: "CreateTags", form: "ResourceId.1=i-0us&Tag.1.Key=k&Tag.1.Value=v", code: "InvalidID"},
	})
	runAt(t, us.URL, "us-east-1", []step{
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0us&InstanceId.2=i-0usregion",
			contains: []string{"<instanceId>i-0us</instanceId>", "<instanceId>i-0usregion</instanceId>"}},
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0eu", code: "InvalidInstanceID.NotFound"},
	})
	// Signed for another region than the endpoint's: refused, whatever it asks.
	runAt(t, eu.URL, "us-east-1", []step{
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0us", code: "AuthFailure",
			contains: []string{"not &#39;us-east-1&#39;"}, lacks: []string{"<instanceId>"}},
		{service: "elasticloadbalancing", action: "DescribeLoadBalancers", code: "SignatureDoesNotMatch"},
	})

	type sent struct{ region, signed, action, ids, err string }
	var got []sent
	for _, c := range s.Calls() {
		got = append(got, sent{c.Region, c.SignedRegion, c.Action, strings.Join(c.InstanceIDs, ","), c.Error})
	}
	for _, want := range []sent{
		{"eu-west-1", "eu-west-1", "DescribeInstances", "i-0us", "InvalidInstanceID.NotFound"},
		{"us-east-1", "us-east-1", "DescribeInstances", "i-0eu", "InvalidInstanceID.NotFound"},
		{"eu-west-1", "us-east-1", "DescribeInstances", "", "AuthFailure"},
	} {
		if !slices.Contains(got, want) {
			t.Errorf("calls %+v lack %+v", got, want)
		}
	}
	if len(got) != 14 {
		t.Errorf("%d calls recorded, want 14: %+v", len(got), got)
	}
}

// TestRegionlessHandler: at ServeHTTP's region-less address a signed request
// is answered for the region it is signed for (what every existing caller
// does: its endpoint and signature name one region), an unsigned one for
// every region.
func TestRegionlessHandler(t *testing.T) {
	s := regionalFake()
	srv := httptest.NewServer(s)
	defer srv.Close()
	runAt(t, srv.URL, "us-east-1", []step{
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0us", contains: []string{"<instanceId>i-0us</instanceId>"}},
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0eu", code: "InvalidInstanceID.NotFound"},
	})
	runAt(t, srv.URL, "", []step{
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0eu&InstanceId.2=i-0us",
			contains: []string{"<instanceId>i-0eu</instanceId>", "<instanceId>i-0us</instanceId>"}},
	})
	var regions []string
	for _, c := range s.Calls() {
		regions = append(regions, c.Region+"/"+c.SignedRegion)
	}
	if want := []string{"us-east-1/us-east-1", "us-east-1/us-east-1", "/"}; !slices.Equal(regions, want) {
		t.Errorf("regions of the calls (addressed/signed) %v, want %v", regions, want)
	}
}
