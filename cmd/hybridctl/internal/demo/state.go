package demo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	cloudproviderapi "k8s.io/cloud-provider/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakelb"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
)

// state is what the view shows.
type state struct {
	nodes    []corev1.Node
	csrs     []certificatesv1.CertificateSigningRequest
	natives  []v1alpha1.NativeCCM
	probes   []gateProbe
	expected int
	// initialized are the nodes seen initialized with pod CIDRs so far (a
	// node a native CCM deletes stays counted).
	initialized map[string]bool
	// outage is set once the demo took machines down; questions are what the
	// fake clouds were asked.
	outage    bool
	questions []fleet.Question
	// deleting holds, per node, the DeletingNode event a CCM recorded
	deleting map[string]nodeEvent
	// services are the demo's LoadBalancer Services, lbs the clouds' load
	// balancers
	services []corev1.Service
	lbs      []fakelb.LoadBalancer
}

// nodeEvent is who reported what about a node: the event's source component
// and the field manager that created it (the client's User-Agent: which CCM
// binary).
type nodeEvent struct{ component, manager, message string }

func observe(ctx context.Context, cs kubernetes.Interface, cc client.Client, expected int) (*state, error) {
	nl, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	cl, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var ncl v1alpha1.NativeCCMList
	if err := cc.List(ctx, &ncl); err != nil {
		return nil, err
	}
	sort.Slice(ncl.Items, func(i, j int) bool { return ncl.Items[i].Name < ncl.Items[j].Name })
	sort.Slice(nl.Items, func(i, j int) bool { return nl.Items[i].Name < nl.Items[j].Name })
	// the kubelets' CSRs by node, each node's in the order filed
	sort.SliceStable(cl.Items, func(i, j int) bool {
		a, b := &cl.Items[i], &cl.Items[j]
		if a.Spec.Username != b.Spec.Username {
			return a.Spec.Username < b.Spec.Username
		}
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	})
	// what a native CCM said when it deleted a node (its event)
	el, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=DeletingNode"})
	if err != nil {
		return nil, err
	}
	deleting := map[string]nodeEvent{}
	for _, e := range el.Items {
		if e.InvolvedObject.Kind == "Node" {
			ev := nodeEvent{component: e.Source.Component, message: e.Message}
			if len(e.ManagedFields) > 0 {
				ev.manager = e.ManagedFields[0].Manager
			}
			deleting[e.InvolvedObject.Name] = ev
		}
	}
	sl, err := cs.CoreV1().Services(shopNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	sort.Slice(sl.Items, func(i, j int) bool { return sl.Items[i].Name < sl.Items[j].Name })
	return &state{nodes: nl.Items, csrs: cl.Items, natives: ncl.Items, expected: expected, deleting: deleting, services: sl.Items}, nil
}

// remember adds the nodes initialized now to seen and keeps seen.
func (s *state) remember(seen map[string]bool) {
	for i := range s.nodes {
		if initialized(&s.nodes[i]) && len(s.nodes[i].Spec.PodCIDRs) > 0 {
			seen[s.nodes[i].Name] = true
		}
	}
	s.initialized = seen
}

func (s *state) node(name string) *corev1.Node {
	for i := range s.nodes {
		if s.nodes[i].Name == name {
			return &s.nodes[i]
		}
	}
	return nil
}

func initialized(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == cloudproviderapi.TaintExternalCloudProvider {
			return false
		}
	}
	return n.Spec.ProviderID != ""
}

func hasShutdownTaint(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == cloudproviderapi.TaintNodeShutdown })
}

func nodeReady(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

func csrDecision(c *certificatesv1.CertificateSigningRequest) (string, string) {
	for _, cond := range c.Status.Conditions {
		if cond.Type == certificatesv1.CertificateApproved || cond.Type == certificatesv1.CertificateDenied {
			return string(cond.Type), cond.Reason
		}
	}
	return "Pending", ""
}

// csrNode is the node whose kubelet filed c ("" if not a kubelet).
func csrNode(c *certificatesv1.CertificateSigningRequest) string {
	n, _ := strings.CutPrefix(c.Spec.Username, "system:node:")
	if n == c.Spec.Username {
		return ""
	}
	return n
}

// counts: the nodes initialized (ever), the nodes whose kubelet got a
// serving certificate approved, the CSRs denied.
func (s *state) counts() (initDone, approved, denied int) {
	initDone = len(s.initialized)
	nodes := map[string]bool{}
	for i := range s.csrs {
		c := &s.csrs[i]
		switch d, _ := csrDecision(c); {
		case d == "Denied":
			denied++
		case d == "Approved" && c.Name != forgedCSR && c.Spec.SignerName == certificatesv1.KubeletServingSignerName && csrNode(c) != "":
			nodes[csrNode(c)] = true
		}
	}
	return initDone, len(nodes), denied
}

// forgedDenied: the impostor's CSR was denied.
func (s *state) forgedDenied() bool {
	i := slices.IndexFunc(s.csrs, func(c certificatesv1.CertificateSigningRequest) bool { return c.Name == forgedCSR })
	if i < 0 {
		return false
	}
	d, _ := csrDecision(&s.csrs[i])
	return d == "Denied"
}

// ready: every node initialized, every kubelet's serving CSR approved, the
// forged one denied, every native CCM running and gated. The demo then
// probes the fence and stages the outage.
func (s *state) ready() bool {
	i, a, _ := s.counts()
	return i == s.expected && a == s.expected && s.forgedDenied() && s.readyNatives() == len(demoClouds)
}

// asked is how often provider's cloud was asked about node.
func (s *state) asked(provider, node string) int {
	for _, q := range s.questions {
		if q.Provider == provider && q.About == node {
			return q.Times
		}
	}
	return 0
}

// outageHandled: the hcloud CCM deleted the gone server's node, the aws CCM
// deleted its terminated instance's node, tainted its stopped instance's node
// and went on to a second pass over its nodes (a third question: each pass
// asks EC2 "exists?" and "shutdown?"). Both CCMs have then seen every NotReady
// node their view holds.
func (s *state) outageHandled() bool {
	if !s.outage || s.node(goneHcloud) != nil || s.node(terminatedAWS) != nil {
		return false
	}
	n := s.node(stoppedAWS)
	return n != nil && hasShutdownTaint(n) && s.asked("aws", stoppedAWS) >= 3
}

func (s *state) done() bool {
	return s.ready() && s.probes != nil && s.outageHandled() && s.servicesServed()
}

// servicesServed: every demo Service has its address from its cloud's load
// balancer, which targets only nodes of that cloud's platform, none of them
// gone.
func (s *state) servicesServed() bool { return len(s.serviceProblems()) == 0 }

func (s *state) serviceProblems() []error {
	var errs []error
	for _, d := range demoServices {
		i := slices.IndexFunc(s.services, func(v corev1.Service) bool { return v.Name == d.name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("Service %s/%s missing", shopNamespace, d.name))
			continue
		}
		ing := s.services[i].Status.LoadBalancer.Ingress
		j := slices.IndexFunc(s.lbs, func(lb fakelb.LoadBalancer) bool { return lb.Service == shopNamespace+"/"+d.name })
		if len(ing) == 0 || j < 0 {
			errs = append(errs, fmt.Errorf("Service %s/%s has no address yet", shopNamespace, d.name))
			continue
		}
		lb := s.lbs[j]
		if addr := ing[0].IP + ing[0].Hostname; lb.Provider != d.cloud || addr != lb.IP {
			errs = append(errs, fmt.Errorf("Service %s/%s: address %s from the %s cloud, want the %s cloud's %s", shopNamespace, d.name, addr, lb.Provider, d.cloud, lb.IP))
		}
		for _, n := range lb.Nodes {
			node := s.node(n)
			if node == nil || node.Labels[names.PlatformLabel] != d.platform || d.region != "" && node.Labels[corev1.LabelTopologyRegion] != d.region {
				errs = append(errs, fmt.Errorf("Service %s/%s: its load balancer targets %s, not a %s node %s (or gone)", shopNamespace, d.name, n, d.platform, d.region))
			}
		}
	}
	if len(s.lbs) != len(demoServices) {
		errs = append(errs, fmt.Errorf("%d load balancers, want one per Service", len(s.lbs)))
	}
	return errs
}

// nativeRunning: Ready (the release is deployed and one of its pods holds
// the lease) and Gated.
func nativeRunning(n *v1alpha1.NativeCCM) bool {
	ok, _ := nativeReady(n)
	return ok && n.Status.Release != nil && n.Status.Leader != nil && apimeta.IsStatusConditionTrue(n.Status.Conditions, v1alpha1.GatedCondition)
}

func nativeReady(n *v1alpha1.NativeCCM) (bool, string) {
	c := apimeta.FindStatusCondition(n.Status.Conditions, "Ready")
	if c == nil {
		return false, "(not reconciled yet)"
	}
	return c.Status == metav1.ConditionTrue, c.Reason + ": " + c.Message
}

func (s *state) readyNatives() int {
	n := 0
	for i := range s.natives {
		if nativeRunning(&s.natives[i]) {
			n++
		}
	}
	return n
}

func (s *state) pending() string {
	i, a, d := s.counts()
	out := fmt.Sprintf("%d/%d nodes initialized, %d/%d kubelet serving certificates approved, %d CSR denied, %d/%d native CCMs installed, running and gated",
		i, s.expected, a, s.expected, d, s.readyNatives(), len(demoClouds))
	switch {
	case !s.outage:
		out += ", outage not started"
	case s.outageHandled():
		out += fmt.Sprintf("; outage: %s deleted by the hcloud CCM, %s deleted and %s tainted shutdown by the %s CCM, %s left alone",
			goneHcloud, terminatedAWS, stoppedAWS, awsNative, downMetal)
	default:
		out += "; outage: waiting for the native CCMs"
	}
	served := 0
	for _, lb := range s.lbs {
		if slices.ContainsFunc(s.services, func(v corev1.Service) bool {
			return shopNamespace+"/"+v.Name == lb.Service && len(v.Status.LoadBalancer.Ingress) > 0
		}) {
			served++
		}
	}
	out += fmt.Sprintf("; %d/%d LoadBalancer Services have an address from their cloud", served, len(demoServices))
	return out
}

// awsLoadBalancerCalls are the EC2 calls the AWS CCM makes for a Classic ELB:
// the account's instances (to register the nodes'), the VPC's subnets and
// route tables, zones, and the security groups it creates and opens.
var awsLoadBalancerCalls = map[string]bool{
	"ec2:DescribeInstances(all)": true, "ec2:DescribeSubnets": true, "ec2:DescribeRouteTables": true,
	"ec2:DescribeAvailabilityZones": true, "ec2:DescribeSecurityGroups": true, "ec2:CreateSecurityGroup": true,
	"ec2:AuthorizeSecurityGroupIngress": true, "ec2:RevokeSecurityGroupIngress": true, "ec2:DeleteSecurityGroup": true,
	"ec2:CreateTags": true,
}

// lbCall: an AWS API call the AWS CCM's service controller makes for its
// Classic ELB (no node's instance).
func lbCall(q fleet.Question) bool {
	return q.Provider == "aws" && (strings.HasPrefix(q.About, "elasticloadbalancing:") || awsLoadBalancerCalls[q.About])
}

// awsCCMManager is the field manager of what the upstream AWS CCM writes (its
// User-Agent): the DeletingNode event it records names it.
const awsCCMManager = "aws-cloud-controller-manager"

// Check verifies the end state in detail.
func (s *state) Check() error {
	var errs []error
	machineOf := map[string]machine{}
	for _, m := range machines() {
		machineOf[m.Name] = m
	}
	for i := range s.nodes {
		n := &s.nodes[i]
		if !initialized(n) || n.Labels[names.PlatformLabel] != machineOf[n.Name].Platform {
			errs = append(errs, fmt.Errorf("node %s not initialized as a %s node", n.Name, machineOf[n.Name].Platform))
		}
		if len(n.Spec.PodCIDRs) == 0 {
			errs = append(errs, fmt.Errorf("node %s has no pod CIDR", n.Name))
		}
		if n.Name != stoppedAWS && hasShutdownTaint(n) {
			errs = append(errs, fmt.Errorf("node %s has the shutdown taint", n.Name))
		}
	}
	if len(s.initialized) != s.expected {
		errs = append(errs, fmt.Errorf("%d nodes were seen initialized, want %d", len(s.initialized), s.expected))
	}
	for name := range machineOf {
		if name != goneHcloud && name != terminatedAWS && s.node(name) == nil {
			errs = append(errs, fmt.Errorf("node %s was deleted", name))
		}
	}
	if s.node(goneHcloud) != nil {
		errs = append(errs, fmt.Errorf("node %s (server deleted) is still there", goneHcloud))
	}
	if s.node(terminatedAWS) != nil {
		errs = append(errs, fmt.Errorf("node %s (instance terminated) is still there", terminatedAWS))
	} else if ev := s.deleting[terminatedAWS]; ev.manager != awsCCMManager {
		errs = append(errs, fmt.Errorf("node %s: want its DeletingNode event from the upstream AWS CCM (%s), got %+v", terminatedAWS, awsCCMManager, ev))
	}
	if n := s.node(downMetal); n != nil && nodeReady(n) == corev1.ConditionTrue {
		errs = append(errs, fmt.Errorf("node %s is Ready, want it down", downMetal))
	}
	if n := s.node(stoppedAWS); n == nil || !hasShutdownTaint(n) {
		errs = append(errs, fmt.Errorf("node %s (instance stopped) has no shutdown taint", stoppedAWS))
	}
	// each cloud was asked only about its own machines (EC2: by instance
	// ID or private DNS name), and the AWS CCM's service controller made
	// only the calls of its Classic ELB (test/aws TestAWSCCMLoadBalancers
	// lists them)
	for _, q := range s.questions {
		switch {
		case q.Foreign:
			errs = append(errs, fmt.Errorf("the %s CCM asked its cloud about %s, a %s node (%d times)", q.Provider, q.About, machineOf[q.About].Platform, q.Times))
		case lbCall(q):
		case machineOf[q.About].Name == "":
			errs = append(errs, fmt.Errorf("the %s CCM asked its cloud about %s (%d times): no machine, no load-balancer call", q.Provider, q.About, q.Times))
		}
	}
	for _, want := range []struct{ provider, node string }{{"hcloud", goneHcloud}, {"aws", terminatedAWS}, {"aws", stoppedAWS}} {
		if s.asked(want.provider, want.node) == 0 {
			errs = append(errs, fmt.Errorf("the %s CCM never asked its cloud about %s", want.provider, want.node))
		}
	}
	approvedFor := map[string]bool{}
	for i := range s.csrs {
		c := &s.csrs[i]
		d, reason := csrDecision(c)
		want := "Approved"
		if c.Name == forgedCSR {
			want = "Denied"
		} else if d == "Approved" {
			approvedFor[csrNode(c)] = true
		}
		if d != want {
			errs = append(errs, fmt.Errorf("CSR %s of %s: %s (%s), want %s", c.Name, c.Spec.Username, d, reason, want))
		}
	}
	for name := range machineOf {
		if !approvedFor[name] {
			errs = append(errs, fmt.Errorf("node %s: no serving CSR of its kubelet approved", name))
		}
	}
	if len(s.natives) != len(demoClouds) {
		errs = append(errs, fmt.Errorf("%d NativeCCMs, want %d", len(s.natives), len(demoClouds)))
	}
	errs = append(errs, s.serviceProblems()...)
	for i := range s.natives {
		n := &s.natives[i]
		if _, why := nativeReady(n); !nativeRunning(n) {
			errs = append(errs, fmt.Errorf("NativeCCM %s not running and gated: %s", n.Name, why))
		} else if !strings.HasPrefix(n.Status.Leader.Pod, n.Status.Release.Name+"-") {
			errs = append(errs, fmt.Errorf("NativeCCM %s: lease held by %q, not a pod of release %s", n.Name, n.Status.Leader.Pod, n.Status.Release.Name))
		}
	}
	if len(s.probes) != 3 || s.probes[0].Allowed || !strings.Contains(s.probes[0].Message, fenceMessage) || !s.probes[1].Allowed ||
		s.probes[2].Allowed || !strings.Contains(s.probes[2].Message, "outside the domain of NativeCCM "+awsNative) {
		errs = append(errs, fmt.Errorf("gate: want the other platform's and the other region's deletes denied by the fence and the own dry-run delete allowed, got %+v", s.probes))
	}
	// each aws region's NativeCCM owns its region's nodes: the first region's
	// aws-web-2 (aws-web-1 is gone), the second's aws-api-1
	for _, want := range []struct {
		name  string
		nodes int32
	}{{awsNative, 1}, {awsNative2, 1}} {
		if i := slices.IndexFunc(s.natives, func(n v1alpha1.NativeCCM) bool { return n.Name == want.name }); i < 0 || s.natives[i].Status.Nodes != want.nodes {
			errs = append(errs, fmt.Errorf("NativeCCM %s: want %d node(s) of its region", want.name, want.nodes))
		}
	}
	return errors.Join(errs...)
}
