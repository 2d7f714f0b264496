package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/cluster"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakelb"
)

// Clouds are the cloud APIs the fleet's machines live in, as the native
// CCMs on the cluster ask them, served on the cluster's gateway (pods reach
// it through their node's default route):
//
//   - EC2 and Elastic Load Balancing (test/fakeec2), what the real AWS CCM
//     asks through the [ServiceOverride] endpoints of AWSCloudConf: an
//     instance per aws machine, running in its machine's region, with the
//     instance ID of its metadata, its node's address and a private DNS
//     name; per region a VPC subnet for load balancers and the nodes'
//     security group, tagged for the cluster. Besides the region-less
//     endpoint (EC2URL), each region of the aws machines has its own, as in
//     AWS (AWSRegionURL, AWSRegionCloudConf): an instance is found only at
//     its own region's;
//   - the instance API of test/testccm (GET ?provider=&node=&providerID= →
//     {"exists", "shutdown"}, TESTCCM_CLOUD_URL = TestCCMURL), which stands
//     in for every other cloud: each cloud knows exactly its own platform's
//     machines, as a real one does — asked about any other node it says "no
//     such instance", which an ungated CCM would take as a reason to delete
//     that node; and their load balancers (test/fakelb) under the same URL.
//
// Every question is recorded (Questions): which cloud was asked about which
// node. Terminate and Stop change a machine in its cloud only; powering it
// off is Fleet.PowerOff.
type Clouds struct {
	// EC2 is the fake AWS API.
	EC2 *fakeec2.Server
	// LoadBalancers are the load balancers of the test/testccm clouds.
	LoadBalancers *fakelb.Cloud

	opts      CloudOptions
	ec2URL    string
	regions   []string          // aws: the default region, then the machines'
	regionURL map[string]string // aws: region → its endpoint's base URL
	cloudURL  string
	servers   []*http.Server
	providers map[string]string // --cloud-provider name → platform

	mu       sync.Mutex
	machines map[string]Machine
	instance map[string]string // aws: instance ID → node name; private DNS name → node name
	gone     map[string]bool
	stopped  map[string]bool
	asked    map[string]int // provider/node → questions
	order    []string       // provider/node, first asked first
}

// CloudOptions describe the clouds' side of AWS (cloud.conf [Global]).
type CloudOptions struct {
	// AWSRegion is the region of AWSCloudConf, and of aws machines that name
	// none (default: the first aws machine's, else eu-central-1). Machines
	// may live in other regions: each is an instance of its own.
	AWSRegion string
	// AWSClusterID is cloud.conf's KubernetesClusterID and the instances'
	// kubernetes.io/cluster/<id> tag (default hybrid-ccm).
	AWSClusterID string
}

// The AWS network every fleet's aws machines of the default region
// (CloudOptions.AWSRegion) are in (cloud.conf names the VPC and subnet); those
// of another region are in that region's (AWSNetwork).
const (
	AWSVPC           = "vpc-0fleet"
	AWSSubnet        = "subnet-0fleet"
	AWSSecurityGroup = "sg-0fleetnodes"
)

// AWSNetwork returns the VPC, subnet and nodes' security group of the aws
// machines of region: AWSVPC, AWSSubnet and AWSSecurityGroup for the default
// region, for another those names suffixed with -<region> (VPCs are regional
// in AWS).
func (c *Clouds) AWSNetwork(region string) (vpc, subnet, securityGroup string) {
	if region == c.opts.AWSRegion {
		return AWSVPC, AWSSubnet, AWSSecurityGroup
	}
	return AWSVPC + "-" + region, AWSSubnet + "-" + region, AWSSecurityGroup + "-" + region
}

// awsRegion is the region an aws machine's instance lives in: its metadata's
// region, else its zone's, else the default.
func (c *Clouds) awsRegion(m Machine) string {
	md := m.metadata()
	if md.Region != "" {
		return md.Region
	}
	if r := fakeec2.RegionOf(md.Zone); r != "" {
		return r
	}
	return c.opts.AWSRegion
}

// StartClouds starts the fleet's clouds on the cluster's gateway. Stop them
// with Close.
func (f *Fleet) StartClouds(opts CloudOptions) (*Clouds, error) {
	ips := map[string]string{}
	for _, n := range f.Nodes() {
		ips[n.Name] = n.IP.String()
	}
	c, err := newClouds(f.Machines, ips, opts)
	if err != nil {
		return nil, err
	}
	if err := c.serve(cluster.Gateway.String()); err != nil {
		return nil, err
	}
	f.clouds = append(f.clouds, c)
	return c, nil
}

// newClouds makes the clouds of machines (ips: node name → address).
func newClouds(machines []Machine, ips map[string]string, opts CloudOptions) (*Clouds, error) {
	set, err := profile.Builtin()
	if err != nil {
		return nil, err
	}
	c := &Clouds{EC2: fakeec2.New(), LoadBalancers: fakelb.New(), providers: map[string]string{},
		machines: map[string]Machine{}, instance: map[string]string{}, gone: map[string]bool{}, stopped: map[string]bool{},
		asked: map[string]int{}}
	// Each profile's --cloud-provider name (what test/testccm tells the
	// cloud it is) belongs to the profile's platforms.
	for _, name := range set.Names() {
		p, _ := set.Get(name)
		for _, platform := range p.Platforms {
			if _, ok := c.providers[p.CCM.CloudProvider]; !ok {
				c.providers[p.CCM.CloudProvider] = platform
			}
		}
	}
	for _, m := range machines {
		c.machines[m.Name] = m
		if m.Platform == "aws" && opts.AWSRegion == "" {
			opts.AWSRegion = m.metadata().Region
		}
	}
	if opts.AWSRegion == "" {
		opts.AWSRegion = "eu-central-1"
	}
	if opts.AWSClusterID == "" {
		opts.AWSClusterID = "hybrid-ccm"
	}
	c.opts = opts
	c.regions = []string{opts.AWSRegion}
	for _, m := range machines {
		if r := c.awsRegion(m); m.Platform == "aws" && !slices.Contains(c.regions, r) {
			c.regions = append(c.regions, r)
		}
	}
	owned := map[string]string{"kubernetes.io/cluster/" + opts.AWSClusterID: "owned"}
	for _, m := range machines {
		if err := c.putInstance(m, ips[m.Name]); err != nil {
			return nil, err
		}
	}
	// What the AWS CCM's Classic ELBs need, in each region: a public subnet
	// for load balancers and the nodes' security group, tagged for the
	// cluster.
	for _, r := range c.regions {
		vpc, subnet, sg := c.AWSNetwork(r)
		c.EC2.PutSubnet(fakeec2.Subnet{ID: subnet, VPC: vpc, Zone: r + "a", CIDR: "10.0.0.0/16", Public: true,
			Tags: map[string]string{"kubernetes.io/cluster/" + opts.AWSClusterID: "shared", "kubernetes.io/role/elb": "1"}})
		c.EC2.PutSecurityGroup(fakeec2.SecurityGroup{ID: sg, Name: opts.AWSClusterID + "-nodes", Description: "nodes", VPC: vpc, Tags: owned})
	}
	return c, nil
}

// add makes a machine that joins the fleet later (Fleet.AddMachine) an
// instance of its cloud, running.
func (c *Clouds) add(m Machine, ip string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.machines[m.Name]; ok {
		return fmt.Errorf("fleet: clouds: machine %s is there already", m.Name)
	}
	if err := c.putInstance(m, ip); err != nil {
		return err
	}
	c.machines[m.Name] = m
	return nil
}

// putInstance makes an aws machine (at address ip) an EC2 instance of its
// region's VPC (AWSNetwork), running, tagged for the cluster (c.mu held or c not shared
// yet). Machines of other platforms need nothing: test/testccm's clouds
// answer from c.machines.
func (c *Clouds) putInstance(m Machine, ip string) error {
	if m.Platform != "aws" {
		return nil
	}
	md := m.metadata()
	if md.InstanceID == "" || ip == "" {
		return fmt.Errorf("fleet: clouds: aws machine %s has no instance ID or no address", m.Name)
	}
	region := c.awsRegion(m)
	vpc, subnet, sg := c.AWSNetwork(region)
	dns := "ip-" + strings.ReplaceAll(ip, ".", "-") + "." + region + ".compute.internal"
	c.EC2.Put(fakeec2.Instance{ID: md.InstanceID, State: fakeec2.Running, Region: region, Zone: md.Zone, Type: md.InstanceType,
		PrivateIP: ip, PrivateDNSName: dns, VPC: vpc, Subnet: subnet, SecurityGroups: []string{sg},
		Tags: map[string]string{"kubernetes.io/cluster/" + c.opts.AWSClusterID: "owned"}})
	c.instance[md.InstanceID], c.instance[dns] = m.Name, m.Name
	return nil
}

// serve starts the two APIs on host (an address; ports are picked), and
// each aws region's endpoint.
func (c *Clouds) serve(host string) error {
	type api struct {
		h   http.Handler
		url *string
	}
	apis := []api{{c.EC2, &c.ec2URL}, {http.HandlerFunc(c.serveInstances), &c.cloudURL}}
	urls := make([]string, len(c.regions))
	for i, r := range c.regions {
		apis = append(apis, api{c.EC2.Region(r), &urls[i]})
	}
	for _, s := range apis {
		lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return errors.Join(fmt.Errorf("fleet: clouds: %w", err), c.Close())
		}
		srv := &http.Server{Handler: s.h, ReadHeaderTimeout: 5 * time.Second}
		c.servers = append(c.servers, srv)
		go func() { _ = srv.Serve(lis) }()
		*s.url = "http://" + lis.Addr().String()
	}
	c.regionURL = map[string]string{}
	for i, r := range c.regions {
		c.regionURL[r] = urls[i]
	}
	return nil
}

// Close stops the APIs.
func (c *Clouds) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, s := range c.servers {
		if err := s.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, s.Close())
		}
	}
	c.servers = nil
	return errors.Join(errs...)
}

// TestCCMURL is test/testccm's TESTCCM_CLOUD_URL: the instance and
// load-balancer API of every cloud but AWS.
func (c *Clouds) TestCCMURL() string { return c.cloudURL }

// EC2URL is the fake AWS API's base URL (the services under /ec2,
// /elasticloadbalancing, /sts, /kms).
func (c *Clouds) EC2URL() string { return c.ec2URL }

// AWSRegionURL is the base URL of one region's endpoint ("" for a region
// no aws machine was in when the clouds started): what EC2 and its siblings
// answer there is that region's alone (fakeec2's Region).
func (c *Clouds) AWSRegionURL(region string) string { return c.regionURL[region] }

// AWSRegion and AWSClusterID are cloud.conf's [Global] Region and
// KubernetesClusterID.
func (c *Clouds) AWSRegion() string    { return c.opts.AWSRegion }
func (c *Clouds) AWSClusterID() string { return c.opts.AWSClusterID }

// AWSRegions are the regions of the aws machines, the default (AWSRegion)
// first.
func (c *Clouds) AWSRegions() []string { return slices.Clone(c.regions) }

// AWSCloudConf is the cloud.conf profiles/aws.yaml asks for off EC2, for the
// aws credentials Secret: [Global] Region, VPC, SubnetID and
// KubernetesClusterID (with all four the AWS CCM asks EC2 nothing at start
// and never needs the metadata service), and every endpoint it could use
// pointed at the fake's region-less endpoint (EC2URL), which answers for
// the region a request is signed for and records anything it does not
// answer.
func (c *Clouds) AWSCloudConf() string { return c.awsCloudConf(c.opts.AWSRegion, c.ec2URL) }

// AWSRegionCloudConf is AWSCloudConf for one CCM of region: that region's
// [Global] Region, VPC and subnet, and every endpoint pointed at that
// region's (AWSRegionURL), as the AWS CCM resolves it for its Region.
func (c *Clouds) AWSRegionCloudConf(region string) (string, error) {
	url, ok := c.regionURL[region]
	if !ok {
		return "", fmt.Errorf("fleet: clouds: no aws machine in region %q (regions %v)", region, c.regions)
	}
	return c.awsCloudConf(region, url), nil
}

func (c *Clouds) awsCloudConf(region, url string) string {
	var b strings.Builder
	vpc, subnet, _ := c.AWSNetwork(region)
	fmt.Fprintf(&b, "[Global]\nRegion = %s\nVPC = %s\nSubnetID = %s\nKubernetesClusterID = %s\n", region, vpc, subnet, c.opts.AWSClusterID)
	for i, s := range []struct{ service, path string }{
		{"EC2", "ec2"}, {"Elastic Load Balancing", "elasticloadbalancing"}, {"Elastic Load Balancing v2", "elasticloadbalancingv2"}, {"KMS", "kms"}, {"STS", "sts"},
	} {
		fmt.Fprintf(&b, "\n[ServiceOverride %q]\nService = %s\nRegion = %s\nURL = %s/%s\nSigningRegion = %s\n", fmt.Sprint(i+1), s.service, region, url, s.path, region)
	}
	return b.String()
}

// Terminate makes the machine's instance gone in its cloud: EC2 says
// terminated, the other clouds "no such instance".
func (c *Clouds) Terminate(name string) error { return c.setState(name, fakeec2.Terminated) }

// Stop makes the machine's instance stopped (shut down) in its cloud.
func (c *Clouds) Stop(name string) error { return c.setState(name, fakeec2.Stopped) }

func (c *Clouds) setState(name, state string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.machines[name]
	if !ok {
		return fmt.Errorf("fleet: clouds: no machine %s", name)
	}
	if m.Platform == "aws" {
		if !c.EC2.SetState(m.metadata().InstanceID, state) {
			return fmt.Errorf("fleet: clouds: EC2 has no instance for %s", name)
		}
		return nil
	}
	if state == fakeec2.Terminated {
		c.gone[name] = true
	} else {
		c.stopped[name] = true
	}
	return nil
}

// serveInstances answers test/testccm: the load-balancer API under
// fakelb.Prefix, and whether an instance exists and is shut down.
func (c *Clouds) serveInstances(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, fakelb.Prefix) {
		c.LoadBalancers.ServeHTTP(w, r)
		return
	}
	provider, node := r.URL.Query().Get("provider"), r.URL.Query().Get("node")
	c.mu.Lock()
	c.ask(provider, node)
	platform := c.providers[provider]
	mine := platform != "" && c.machines[node].Platform == platform
	exists, shutdown := mine && !c.gone[node], mine && c.stopped[node]
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]bool{"exists": exists, "shutdown": shutdown})
}

// ask records a question (c.mu held).
func (c *Clouds) ask(provider, about string) {
	key := provider + "/" + about
	if c.asked[key] == 0 {
		c.order = append(c.order, key)
	}
	c.asked[key]++
}

// Question is what one cloud was asked about one thing, and how often.
type Question struct {
	// Provider is the cloud: test/testccm's --cloud-provider name, or aws.
	Provider string
	// About is a node's name, or for EC2 what no node answers: an instance
	// ID or private DNS name of no machine, "ec2:DescribeInstances(all)" (a
	// listing of every instance), "filter:<name=value>", or
	// "<service>:<Action>" of any other call.
	About string
	// Foreign is set when About is a machine of another platform than the
	// cloud's: what a gated CCM never asks.
	Foreign bool
	Times   int
}

// Questions are the clouds' questions in the order first asked: the
// test/testccm clouds', then EC2's, by node where a call names an instance
// (by ID or private DNS name).
func (c *Clouds) Questions() []Question {
	c.mu.Lock()
	out := make([]Question, 0, len(c.order))
	for _, k := range c.order {
		p, n, _ := strings.Cut(k, "/")
		out = append(out, Question{Provider: p, About: n, Times: c.asked[k], Foreign: c.foreign(c.providers[p], n)})
	}
	instance := c.instance
	c.mu.Unlock()

	var order []string
	times := map[string]int{}
	ask := func(about string) {
		if times[about] == 0 {
			order = append(order, about)
		}
		times[about]++
	}
	for _, call := range c.EC2.Calls() {
		if call.Service != fakeec2.EC2 || call.Action != "DescribeInstances" {
			ask(strings.ReplaceAll(call.Service+":"+call.Action, " ", "_"))
			continue
		}
		if len(call.InstanceIDs) == 0 && len(call.Filters) == 0 {
			ask("ec2:DescribeInstances(all)")
		}
		for _, id := range call.InstanceIDs {
			if n, ok := instance[id]; ok {
				ask(n)
			} else {
				ask(id)
			}
		}
		for _, f := range call.Filters {
			name, values, _ := strings.Cut(f, "=")
			if name != "private-dns-name" && name != "instance-id" {
				ask("filter:" + strings.ReplaceAll(f, " ", "_"))
				continue
			}
			for _, v := range strings.Split(values, ",") {
				if n, ok := instance[v]; ok {
					ask(n)
				} else {
					ask(v)
				}
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range order {
		out = append(out, Question{Provider: "aws", About: k, Times: times[k], Foreign: c.foreign("aws", k)})
	}
	return out
}

// foreign: about is a machine, not of platform (c.mu held).
func (c *Clouds) foreign(platform, about string) bool {
	m, ok := c.machines[about]
	return ok && m.Platform != platform
}

// Asked is how often provider's cloud was asked about a node.
func (c *Clouds) Asked(provider, node string) int {
	for _, q := range c.Questions() {
		if q.Provider == provider && q.About == node {
			return q.Times
		}
	}
	return 0
}

// AllLoadBalancers are every cloud's load balancers: test/testccm's, then
// the Classic ELBs the AWS CCM built in the fake EC2 (the Service from the
// ELB's tag, the DNS name as address, the registered instances as node
// names).
func (c *Clouds) AllLoadBalancers() []fakelb.LoadBalancer {
	out := c.LoadBalancers.LoadBalancers()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, lb := range c.EC2.LoadBalancers() {
		var nodes []string
		for _, id := range lb.Instances {
			if n, ok := c.instance[id]; ok {
				nodes = append(nodes, n)
			} else {
				nodes = append(nodes, id)
			}
		}
		slices.Sort(nodes)
		out = append(out, fakelb.LoadBalancer{Provider: "aws", Service: lb.Tags["kubernetes.io/service-name"], IP: lb.DNSName, Nodes: nodes})
	}
	return out
}
