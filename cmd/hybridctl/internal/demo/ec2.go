package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakelb"
)

// The AWS side of the demo: what the aws profile's cloud.conf says off EC2.
const (
	awsRegion    = "eu-central-1"
	awsClusterID = "hybrid-demo"
)

// fakeEC2 is the EC2 API the real AWS CCM asks (test/fakeec2), on loopback:
// an instance, running, for each aws node of the fleet, with the instance ID
// of its Talos metadata (the providerID aws:///<zone>/<id> talos-ccm gives
// the node). Every request is recorded: the demo shows what EC2 was asked
// about which node.
type fakeEC2 struct {
	srv *http.Server
	url string
	api *fakeec2.Server
	// node and id map instance IDs and node names both ways.
	node map[string]string
	id   map[string]string
}

func startFakeEC2(nodes []simNode) (*fakeEC2, error) {
	e := &fakeEC2{api: fakeec2.New(), node: map[string]string{}, id: map[string]string{}}
	for _, n := range nodes {
		if n.md.Platform != "aws" {
			continue
		}
		e.node[n.md.InstanceID], e.id[n.name] = n.name, n.md.InstanceID
		e.api.Put(fakeec2.Instance{ID: n.md.InstanceID, State: fakeec2.Running, Zone: n.md.Zone, Type: n.md.InstanceType,
			PrivateIP: n.ip, PrivateDNSName: "ip-" + strings.ReplaceAll(n.ip, ".", "-") + "." + awsRegion + ".compute.internal",
			VPC: awsVPC, Subnet: awsSubnet, SecurityGroups: []string{awsNodeGroup},
			Tags: map[string]string{"kubernetes.io/cluster/" + awsClusterID: "owned"}})
	}
	// what the AWS CCM's Classic ELBs need: a public subnet for load
	// balancers and the nodes' security group, tagged for the cluster
	e.api.PutSubnet(fakeec2.Subnet{ID: awsSubnet, VPC: awsVPC, Zone: awsRegion + "a", CIDR: "10.0.0.0/16", Public: true,
		Tags: map[string]string{"kubernetes.io/cluster/" + awsClusterID: "shared", "kubernetes.io/role/elb": "1"}})
	e.api.PutSecurityGroup(fakeec2.SecurityGroup{ID: awsNodeGroup, Name: awsClusterID + "-nodes", Description: "nodes", VPC: awsVPC,
		Tags: map[string]string{"kubernetes.io/cluster/" + awsClusterID: "owned"}})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e.url = "http://" + l.Addr().String()
	e.srv = &http.Server{Handler: e.api, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = e.srv.Serve(l) }()
	return e, nil
}

// The demo's AWS network (cloud.conf names the VPC and subnet too).
const (
	awsVPC       = "vpc-0demo"
	awsSubnet    = "subnet-0demo"
	awsNodeGroup = "sg-0demonodes"
)

// loadBalancers are the Classic ELBs the AWS CCM built, as the demo shows
// load balancers: the Service from the ELB's tag, the DNS name as address,
// the registered instances as node names.
func (e *fakeEC2) loadBalancers() []fakelb.LoadBalancer {
	var out []fakelb.LoadBalancer
	for _, lb := range e.api.LoadBalancers() {
		var nodes []string
		for _, id := range lb.Instances {
			if n, ok := e.node[id]; ok {
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

func (e *fakeEC2) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return e.srv.Close()
	}
	return nil
}

// cloudConf is the cloud.conf of the aws credentials Secret: [Global] Region,
// VPC, SubnetID and KubernetesClusterID (with all four the AWS CCM asks EC2
// nothing at start and never needs the metadata service), and every endpoint
// it could use pointed at the fake, which answers only EC2's DescribeInstances
// and records anything else.
func (e *fakeEC2) cloudConf() string {
	var b strings.Builder
	fmt.Fprintf(&b, "[Global]\nRegion = %s\nVPC = vpc-0demo\nSubnetID = subnet-0demo\nKubernetesClusterID = %s\n", awsRegion, awsClusterID)
	for i, s := range []struct{ service, path string }{
		{"EC2", "ec2"}, {"Elastic Load Balancing", "elasticloadbalancing"}, {"KMS", "kms"}, {"STS", "sts"},
	} {
		fmt.Fprintf(&b, "\n[ServiceOverride %q]\nService = %s\nRegion = %s\nURL = %s/%s\nSigningRegion = %s\n", fmt.Sprint(i+1), s.service, awsRegion, e.url, s.path, awsRegion)
	}
	return b.String()
}

// setState changes the state of node's instance (fakeec2.Terminated,
// fakeec2.Stopped).
func (e *fakeEC2) setState(node, state string) error {
	if !e.api.SetState(e.id[node], state) {
		return fmt.Errorf("fake EC2: no instance for node %s", node)
	}
	return nil
}

// questions are the fake's calls as questions about nodes: each instance ID
// asked about (by its node's name when it is a demo node's), each node looked
// up by private DNS name; a listing of every instance or any other call is a question about the call itself
// (service:action), which no demo node answers.
func (e *fakeEC2) questions() []cloudQuestion {
	var order []string
	times := map[string]int{}
	ask := func(about string) {
		if times[about] == 0 {
			order = append(order, about)
		}
		times[about]++
	}
	for _, c := range e.api.Calls() {
		if c.Service != "ec2" || c.Action != "DescribeInstances" {
			ask(strings.ReplaceAll(c.Service+":"+c.Action, " ", "_"))
			continue
		}
		if len(c.InstanceIDs) == 0 && len(c.Filters) == 0 {
			ask("ec2:DescribeInstances(all)")
		}
		for _, id := range c.InstanceIDs {
			if n, ok := e.node[id]; ok {
				ask(n)
			} else {
				ask(id)
			}
		}
		for _, f := range c.Filters {
			if name, v, _ := strings.Cut(f, "="); name == "private-dns-name" {
				ask(v)
			} else {
				ask("filter:" + strings.ReplaceAll(f, " ", "_"))
			}
		}
	}
	out := make([]cloudQuestion, 0, len(order))
	for _, k := range order {
		out = append(out, cloudQuestion{Provider: "aws", Node: k, Times: times[k]})
	}
	return out
}
