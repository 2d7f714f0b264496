package fakeec2_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
)

const (
	vpc    = "vpc-0test"
	public = "subnet-0public"
	tag    = "kubernetes.io/cluster/test"
)

func newFake() *fakeec2.Server {
	s := fakeec2.New(
		fakeec2.Instance{ID: "i-01", State: fakeec2.Running, Zone: "eu-west-1a", VPC: vpc, Subnet: public, SecurityGroups: []string{"sg-0nodes"}},
		fakeec2.Instance{ID: "i-02", State: fakeec2.Terminated, Zone: "eu-west-1a", VPC: vpc, Subnet: public},
		fakeec2.Instance{ID: "i-03", State: fakeec2.Running, Zone: "eu-west-1a", VPC: "vpc-0other"},
	)
	s.PutSubnet(fakeec2.Subnet{ID: public, VPC: vpc, Zone: "eu-west-1a", CIDR: "10.0.0.0/24", Public: true, Tags: map[string]string{tag: "shared"}})
	s.PutSubnet(fakeec2.Subnet{ID: "subnet-0private", VPC: vpc, Zone: "eu-west-1b", CIDR: "10.0.1.0/24"})
	s.PutSecurityGroup(fakeec2.SecurityGroup{ID: "sg-0nodes", Name: "nodes", Description: "nodes", VPC: vpc, Tags: map[string]string{tag: "owned"}})
	return s
}

// step is one Query API request and what its answer must hold.
type step struct {
	// service is the path: ec2 or elasticloadbalancing.
	service string
	// form is the request without Action/Version; action is added.
	action string
	form   string
	// code is the error code expected; empty: success.
	code string
	// contains are strings the answer must hold.
	contains []string
	// lacks are strings it must not hold.
	lacks []string
}

// run posts the steps in order to a fake as the SDK would (form-encoded,
// SigV4 credential scope for eu-west-1 in the Authorization header).
func run(t *testing.T, s *fakeec2.Server, steps []step) {
	t.Helper()
	srv := httptest.NewServer(s)
	defer srv.Close()
	runAt(t, srv.URL, "eu-west-1", steps)
}

// runAt posts the steps in order to the endpoint at base, signed for region
// ("" unsigned).
func runAt(t *testing.T, base, region string, steps []step) {
	t.Helper()
	for i, st := range steps {
		got, body := post(t, base, region, st.service, st.action, st.form)
		if got != st.code {
			t.Fatalf("step %d %s %s: error %q, want %q\n%s", i, st.service, st.action, got, st.code, body)
		}
		for _, c := range st.contains {
			if !strings.Contains(body, c) {
				t.Errorf("step %d %s %s: answer lacks %q\n%s", i, st.service, st.action, c, body)
			}
		}
		for _, c := range st.lacks {
			if strings.Contains(body, c) {
				t.Errorf("step %d %s %s: answer holds %q\n%s", i, st.service, st.action, c, body)
			}
		}
	}
}

var codeRE = regexp.MustCompile(`<Code>([^<]*)</Code>`)

// post sends one Query API request to the service under base as the SDK
// would, signed for region ("" unsigned), and returns the error code of the
// answer ("" for success) and the answer.
func post(t *testing.T, base, region, service, action, query string) (code, body string) {
	t.Helper()
	form, err := url.ParseQuery(query)
	if err != nil {
		t.Fatal(err)
	}
	form.Set("Action", action)
	req, err := http.NewRequest(http.MethodPost, base+"/"+service, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if region != "" {
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIATEST/20250101/"+region+"/"+service+"/aws4_request, SignedHeaders=host, Signature=0")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if m := codeRE.FindSubmatch(b); m != nil && resp.StatusCode != http.StatusOK {
		code = string(m[1])
	}
	return code, string(b)
}

// TestClassicLoadBalancer walks a load balancer through the life the AWS
// CCM gives it, with the errors AWS answers when a step is out of order.
func TestClassicLoadBalancer(t *testing.T) {
	s := newFake()
	run(t, s, []step{
		{service: "elasticloadbalancing", action: "DescribeLoadBalancers", form: "LoadBalancerNames.member.1=web", code: "LoadBalancerNotFound",
			contains: []string{"<ErrorResponse", "<Type>Sender</Type>"}},
		{service: "ec2", action: "DescribeSubnets", form: "Filter.1.Name=vpc-id&Filter.1.Value.1=" + vpc,
			contains: []string{"<subnetId>" + public + "</subnetId>", "<subnetId>subnet-0private</subnetId>", "<key>" + tag + "</key>"}},
		{service: "ec2", action: "DescribeRouteTables", form: "Filter.1.Name=vpc-id&Filter.1.Value.1=" + vpc,
			contains: []string{"<gatewayId>igw-0test</gatewayId>", "<subnetId>" + public + "</subnetId>", "<main>true</main>"},
			lacks:    []string{"<subnetId>subnet-0private</subnetId>"}},
		{service: "ec2", action: "DescribeAvailabilityZones", contains: []string{"<zoneName>eu-west-1a</zoneName>", "<zoneType>availability-zone</zoneType>"}},
		{service: "ec2", action: "CreateSecurityGroup", form: "GroupName=k8s-elb-web&GroupDescription=web&VpcId=" + vpc +
			"&TagSpecification.1.ResourceType=security-group&TagSpecification.1.Tag.1.Key=" + tag + "&TagSpecification.1.Tag.1.Value=owned",
			contains: []string{"<groupId>sg-"}},
		{service: "ec2", action: "CreateSecurityGroup", form: "GroupName=k8s-elb-web&GroupDescription=web&VpcId=" + vpc, code: "InvalidGroup.Duplicate"},
		// An ELB needs subnets of one VPC, one per zone, and groups of that VPC.
		{service: "elasticloadbalancing", action: "CreateLoadBalancer", form: "LoadBalancerName=web&Listeners.member.1.Protocol=tcp" +
			"&Listeners.member.1.LoadBalancerPort=80&Listeners.member.1.InstancePort=30080&Subnets.member.1=subnet-0nope&SecurityGroups.member.1=sg-0nodes",
			code: "SubnetNotFound"},
		{service: "elasticloadbalancing", action: "CreateLoadBalancer", form: "LoadBalancerName=web&Listeners.member.1.Protocol=tcp" +
			"&Listeners.member.1.LoadBalancerPort=80&Listeners.member.1.InstancePort=30080&Subnets.member.1=" + public + "&SecurityGroups.member.1=sg-0nope",
			code: "InvalidSecurityGroup"},
		{service: "elasticloadbalancing", action: "CreateLoadBalancer", form: "LoadBalancerName=web&Listeners.member.1.Protocol=tcp" +
			"&Listeners.member.1.LoadBalancerPort=80&Listeners.member.1.InstancePort=30080&Subnets.member.1=" + public + "&SecurityGroups.member.1=sg-0nodes" +
			"&Tags.member.1.Key=" + tag + "&Tags.member.1.Value=owned",
			contains: []string{"<CreateLoadBalancerResult><DNSName>web-", ".eu-west-1.elb.amazonaws.com</DNSName>"}},
		{service: "elasticloadbalancing", action: "DescribeLoadBalancerAttributes", form: "LoadBalancerName=web",
			contains: []string{"<ConnectionDraining><Enabled>false</Enabled><Timeout>300</Timeout>", "<IdleTimeout>60</IdleTimeout>"}},
		// Modify changes what it names and keeps the rest.
		{service: "elasticloadbalancing", action: "ModifyLoadBalancerAttributes", form: "LoadBalancerName=web&LoadBalancerAttributes.ConnectionSettings.IdleTimeout=120",
			contains: []string{"<IdleTimeout>120</IdleTimeout>", "<Timeout>300</Timeout>"}},
		{service: "elasticloadbalancing", action: "ConfigureHealthCheck", form: "LoadBalancerName=web&HealthCheck.Target=TCP:30080" +
			"&HealthCheck.Interval=10&HealthCheck.Timeout=5&HealthCheck.UnhealthyThreshold=6&HealthCheck.HealthyThreshold=2",
			contains: []string{"<Target>TCP:30080</Target>"}},
		// Terminated instances and those of another VPC cannot be registered.
		{service: "elasticloadbalancing", action: "RegisterInstancesWithLoadBalancer", form: "LoadBalancerName=web&Instances.member.1.InstanceId=i-02", code: "InvalidInstance"},
		{service: "elasticloadbalancing", action: "RegisterInstancesWithLoadBalancer", form: "LoadBalancerName=web&Instances.member.1.InstanceId=i-03", code: "InvalidInstance"},
		{service: "elasticloadbalancing", action: "RegisterInstancesWithLoadBalancer", form: "LoadBalancerName=web&Instances.member.1.InstanceId=i-01",
			contains: []string{"<Instances><member><InstanceId>i-01</InstanceId></member></Instances>"}},
		{service: "elasticloadbalancing", action: "DescribeLoadBalancers", form: "LoadBalancerNames.member.1=web",
			contains: []string{"<LoadBalancerName>web</LoadBalancerName>", "<InstanceId>i-01</InstanceId>", "<InstancePort>30080</InstancePort>",
				"<Protocol>TCP</Protocol>", "<Scheme>internet-facing</Scheme>", "<VPCId>" + vpc + "</VPCId>", "<GroupName>nodes</GroupName>"}},
		{service: "elasticloadbalancing", action: "DeregisterInstancesFromLoadBalancer", form: "LoadBalancerName=web&Instances.member.1.InstanceId=i-01",
			lacks: []string{"i-01"}},
		{service: "elasticloadbalancing", action: "DeregisterInstancesFromLoadBalancer", form: "LoadBalancerName=web&Instances.member.1.InstanceId=i-01", code: "InvalidInstance"},
		{service: "elasticloadbalancing", action: "AddTags", form: "LoadBalancerNames.member.1=web&Tags.member.1.Key=team&Tags.member.1.Value=shop"},
		// A Service's port changed: one listener goes, another comes.
		{service: "elasticloadbalancing", action: "CreateLoadBalancerListeners", form: "LoadBalancerName=web&Listeners.member.1.Protocol=TCP" +
			"&Listeners.member.1.LoadBalancerPort=80&Listeners.member.1.InstancePort=30081", code: "DuplicateListener"},
		{service: "elasticloadbalancing", action: "DeleteLoadBalancerListeners", form: "LoadBalancerName=web&LoadBalancerPorts.member.1=80"},
		{service: "elasticloadbalancing", action: "CreateLoadBalancerListeners", form: "LoadBalancerName=web&Listeners.member.1.Protocol=TCP" +
			"&Listeners.member.1.LoadBalancerPort=8080&Listeners.member.1.InstancePort=30081"},
		{service: "elasticloadbalancing", action: "DescribeLoadBalancers", form: "LoadBalancerNames.member.1=web",
			contains: []string{"<LoadBalancerPort>8080</LoadBalancerPort><InstanceProtocol>TCP</InstanceProtocol><InstancePort>30081</InstancePort>"},
			lacks:    []string{"<LoadBalancerPort>80</LoadBalancerPort>"}},
		// A group in use by a load balancer cannot go; deleting the load
		// balancer frees it, and deleting it twice succeeds.
		{service: "ec2", action: "DeleteSecurityGroup", form: "GroupId=sg-0nodes", code: "DependencyViolation"},
		{service: "elasticloadbalancing", action: "DeleteLoadBalancer", form: "LoadBalancerName=web"},
		{service: "elasticloadbalancing", action: "DeleteLoadBalancer", form: "LoadBalancerName=web"},
		{service: "elasticloadbalancing", action: "DescribeLoadBalancers", form: "LoadBalancerNames.member.1=web", code: "LoadBalancerNotFound"},
	})
	if lbs := s.LoadBalancers(); len(lbs) != 0 {
		t.Errorf("load balancers left: %+v", lbs)
	}
	// Every call is recorded with what it names.
	var named []string
	for _, c := range s.Calls() {
		if c.Service == fakeec2.ELB && c.Resource != "web" {
			t.Errorf("call %s does not name load balancer web", c)
		}
		if c.AccessKey != "AKIATEST" || c.Region != "eu-west-1" || c.SignedRegion != "eu-west-1" {
			t.Errorf("call %s: key %q region %q signed for %q", c, c.AccessKey, c.Region, c.SignedRegion)
		}
		named = append(named, c.String())
	}
	if !slices.Contains(named, "elasticloadbalancing@eu-west-1 RegisterInstancesWithLoadBalancer web InstanceIds=i-02 -> InvalidInstance") {
		t.Errorf("calls %v lack the refused registration", named)
	}
}

// TestSecurityGroupRules: rules as EC2 keeps them, grouped by protocol and
// port range, with its errors for duplicates, missing rules and groups in use.
func TestSecurityGroupRules(t *testing.T) {
	s := newFake()
	s.PutSecurityGroup(fakeec2.SecurityGroup{ID: "sg-0elb", Name: "k8s-elb-web", Description: "elb", VPC: vpc})
	run(t, s, []step{
		{service: "ec2", action: "AuthorizeSecurityGroupIngress", form: "GroupId=sg-0elb&IpPermissions.1.IpProtocol=tcp&IpPermissions.1.FromPort=80" +
			"&IpPermissions.1.ToPort=80&IpPermissions.1.IpRanges.1.CidrIp=0.0.0.0/0&IpPermissions.2.IpProtocol=icmp&IpPermissions.2.FromPort=3" +
			"&IpPermissions.2.ToPort=4&IpPermissions.2.IpRanges.1.CidrIp=0.0.0.0/0"},
		{service: "ec2", action: "AuthorizeSecurityGroupIngress", form: "GroupId=sg-0elb&IpPermissions.1.IpProtocol=tcp&IpPermissions.1.FromPort=80" +
			"&IpPermissions.1.ToPort=80&IpPermissions.1.IpRanges.1.CidrIp=0.0.0.0/0", code: "InvalidPermission.Duplicate"},
		{service: "ec2", action: "AuthorizeSecurityGroupIngress", form: "GroupId=sg-0nodes&IpPermissions.1.IpProtocol=-1&IpPermissions.1.Groups.1.GroupId=sg-0elb"},
		{service: "ec2", action: "DescribeSecurityGroups", form: "Filter.1.Name=ip-permission.group-id&Filter.1.Value.1=sg-0elb",
			contains: []string{"<groupId>sg-0nodes</groupId>", "<ipProtocol>-1</ipProtocol>"}, lacks: []string{"<groupName>k8s-elb-web</groupName>", "<fromPort>"}},
		{service: "ec2", action: "DescribeSecurityGroups", form: "GroupId.1=sg-0elb",
			contains: []string{"<ipProtocol>tcp</ipProtocol><fromPort>80</fromPort><toPort>80</toPort>", "<cidrIp>0.0.0.0/0</cidrIp>", "<ipProtocol>icmp</ipProtocol>"}},
		{service: "ec2", action: "DescribeSecurityGroups", form: "GroupId.1=sg-0nope", code: "InvalidGroup.NotFound"},
		{service: "ec2", action: "DeleteSecurityGroup", form: "GroupId=sg-0elb", code: "DependencyViolation"},
		{service: "ec2", action: "RevokeSecurityGroupIngress", form: "GroupId=sg-0nodes&IpPermissions.1.IpProtocol=-1&IpPermissions.1.Groups.1.GroupId=sg-0elb"},
		{service: "ec2", action: "RevokeSecurityGroupIngress", form: "GroupId=sg-0nodes&IpPermissions.1.IpProtocol=-1&IpPermissions.1.Groups.1.GroupId=sg-0elb",
			code: "InvalidPermission.NotFound"},
		{service: "ec2", action: "DeleteSecurityGroup", form: "GroupId=sg-0elb"},
		{service: "ec2", action: "CreateTags", form: "ResourceId.1=sg-0nodes&Tag.1.Key=team&Tag.1.Value=shop"},
		{service: "ec2", action: "DescribeSecurityGroups", form: "Filter.1.Name=tag:team&Filter.1.Value.1=shop", contains: []string{"<groupId>sg-0nodes</groupId>"}},
		{service: "ec2", action: "DescribeSecurityGroups", form: "Filter.1.Name=owner-id&Filter.1.Value.1=1", code: "InvalidParameterValue"},
	})
	if g := s.SecurityGroups(); len(g) != 1 || len(g[0].Ingress) != 0 {
		t.Errorf("security groups %+v, want sg-0nodes without rules", g)
	}
}

// TestUnknownActions: what the fake does not answer is an InvalidAction in
// the service's own error format, and Unknown names it.
func TestUnknownActions(t *testing.T) {
	s := newFake()
	run(t, s, []step{
		{service: "ec2", action: "ModifyInstanceAttribute", code: fakeec2.InvalidAction, contains: []string{"<Response><Errors><Error>"}},
		{service: "elasticloadbalancing", action: "CreateLoadBalancerPolicy", code: fakeec2.InvalidAction, contains: []string{"<ErrorResponse"}},
		{service: "sts", action: "GetCallerIdentity", code: fakeec2.InvalidAction},
		{service: "ec2", action: "DescribeInstances", contains: []string{"<instanceId>i-01</instanceId>", "<groupId>sg-0nodes</groupId>"}},
	})
	var unknown []string
	for _, c := range s.Unknown() {
		unknown = append(unknown, c.Service+" "+c.Action)
	}
	want := []string{"ec2 ModifyInstanceAttribute", "elasticloadbalancing CreateLoadBalancerPolicy", "sts GetCallerIdentity"}
	if !slices.Equal(unknown, want) {
		t.Errorf("Unknown() = %v, want %v", unknown, want)
	}
}

// TestInstanceAddresses: an instance with a private address has it on its
// primary network interface, attached as device 0 and in use, with its
// private DNS name: what the AWS CCM's cloud-node controller makes the
// node's InternalIP, InternalDNS and Hostname from. One without an address
// has no network interface.
func TestInstanceAddresses(t *testing.T) {
	s := newFake()
	s.Put(fakeec2.Instance{ID: "i-0a1", State: fakeec2.Running, Zone: "eu-west-1a", VPC: vpc, Subnet: public,
		PrivateIP: "10.0.0.5", PrivateDNSName: "ip-10-0-0-5.eu-west-1.compute.internal"})
	run(t, s, []step{
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-0a1", contains: []string{
			"<privateIpAddress>10.0.0.5</privateIpAddress>",
			"<networkInterfaceSet><item><networkInterfaceId>eni-0a1</networkInterfaceId><subnetId>" + public + "</subnetId><vpcId>" + vpc + "</vpcId><status>in-use</status>",
			"<attachment><attachmentId>eni-attach-0a1</attachmentId><deviceIndex>0</deviceIndex><status>attached</status></attachment>",
			"<privateIpAddressesSet><item><privateIpAddress>10.0.0.5</privateIpAddress><privateDnsName>ip-10-0-0-5.eu-west-1.compute.internal</privateDnsName><primary>true</primary></item></privateIpAddressesSet>",
		}},
		{service: "ec2", action: "DescribeInstances", form: "InstanceId.1=i-01", lacks: []string{"<networkInterfaceSet><item>"}},
	})
}
