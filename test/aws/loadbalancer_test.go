package aws

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
)

// The VPC of cloud.conf [Global] as the fake holds it for load balancers.
const (
	lbVPC = "vpc-0fake"
	// publicSubnet is cloud.conf's SubnetID: tagged for the cluster and
	// for internet-facing ELBs, routed to an internet gateway.
	publicSubnet = "subnet-0fake"
	// privateSubnet is tagged for the cluster but has no internet gateway:
	// no place for an internet-facing ELB.
	privateSubnet = "subnet-0private"
	// nodeGroup is the security group of the cluster's instances.
	nodeGroup  = "sg-0nodes"
	clusterTag = "kubernetes.io/cluster/" + clusterID

	awsClass    = "hybridccm.io/aws"
	hcloudClass = "hybridccm.io/hcloud"
	// shop is the namespace of the Services.
	shop = "shop"
)

// lbNodes are the nodes of the load-balancer test: aws nodes with running
// instances in the VPC (one labelled out of load balancers) and hcloud nodes.
var lbNodes = []node{
	{name: "aws-web-1", platform: "aws", instanceID: "i-0000000000000c001", instance: fakeec2.Running, ready: true},
	{name: "aws-web-2", platform: "aws", instanceID: "i-0000000000000c002", instance: fakeec2.Running, ready: true},
	{name: "aws-web-excluded", platform: "aws", instanceID: "i-0000000000000c003", instance: fakeec2.Running, ready: true,
		labels: map[string]string{corev1.LabelNodeExcludeBalancers: "true"}},
	{name: "hcloud-web-1", platform: "hcloud", providerID: "hcloud://2001", ready: true},
	{name: "hcloud-web-2", platform: "hcloud", providerID: "hcloud://2002", ready: true},
}

// awsTargets are the instances an ELB of this cluster should target: those
// of the aws nodes not excluded.
var awsTargets = []string{"i-0000000000000c001", "i-0000000000000c002"}

// joining is an aws node that registers while a load balancer exists.
var joining = node{name: "aws-web-3", platform: "aws", instanceID: "i-0000000000000c004", instance: fakeec2.Running, ready: true}

// lbCloud is the fake AWS account of the load-balancer test: the VPC with a
// public and a private subnet, the nodes' security group and their instances.
func lbCloud() *fakeec2.Server {
	var instances []fakeec2.Instance
	for i, n := range append(slices.Clone(lbNodes), joining) {
		if n.instanceID == "" {
			continue
		}
		instances = append(instances, fakeec2.Instance{ID: n.instanceID, State: n.instance, Zone: zone, Type: "m5.large",
			PrivateIP: fmt.Sprintf("10.0.0.%d", i+50), PrivateDNSName: fmt.Sprintf("ip-10-0-0-%d.%s.compute.internal", i+50, region),
			VPC: lbVPC, Subnet: publicSubnet, SecurityGroups: []string{nodeGroup}, Tags: map[string]string{clusterTag: "owned"}})
	}
	ec2 := fakeec2.New(instances...)
	ec2.PutSubnet(fakeec2.Subnet{ID: publicSubnet, VPC: lbVPC, Zone: zone, CIDR: "10.0.0.0/24", Public: true,
		Tags: map[string]string{clusterTag: "shared", "kubernetes.io/role/elb": "1"}})
	ec2.PutSubnet(fakeec2.Subnet{ID: privateSubnet, VPC: lbVPC, Zone: "eu-west-1b", CIDR: "10.0.1.0/24",
		Tags: map[string]string{clusterTag: "shared", "kubernetes.io/role/internal-elb": "1"}})
	ec2.PutSecurityGroup(fakeec2.SecurityGroup{ID: nodeGroup, Name: clusterID + "-nodes", Description: "nodes", VPC: lbVPC,
		Tags: map[string]string{clusterTag: "owned"}})
	return ec2
}

// TestAWSCCMLoadBalancers runs the upstream AWS CCM with its service
// controller on (--controllers=cloud-node-lifecycle,service, as the
// coordinator renders the release of a NativeCCM with spec.loadBalancers
// enabled) against the fake EC2 and Classic ELB APIs: first straight against
// the API server (Direct), then behind ccm-gate serving class
// hybridccm.io/aws and the default, with the fence and exactly the RBAC of
// the release (Gated).
func TestAWSCCMLoadBalancers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	ec2 := lbCloud()
	conf := cloudConf(region, serveEC2(t, ec2, region)[region])
	secret := fakeSecret

	for _, ns := range []string{ccmNamespace, shop} {
		if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, n := range lbNodes {
		register(t, ctx, n)
	}
	ccm := renderCCM(t, ctx, "native-ccm-aws-lb", &release.LoadBalancerSettings{Class: awsClass, Default: true})

	// A Service of each cloud's class; the aws one waits for the gate.
	awsSvc := createService(t, ctx, "web-aws", awsClass)
	hcloudSvc := createService(t, ctx, "web-hcloud", hcloudClass)

	t.Run("Direct", func(t *testing.T) {
		ec2.Reset()
		const sa = "aws-lb-direct"
		token := grantRelease(t, ctx, sa, true)
		kubeconfig := writeTokenKubeconfig(t, &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}}, token)
		out := startCCM(t, ctx, ccmProcess{container: ccm, conf: conf, kubeconfig: kubeconfig, authKubeconfig: kubeconfig, secret: secret})
		calls := &callLog{ec2: ec2}

		start := time.Now()
		svc := createService(t, ctx, "web", "")
		lb := waitELB(t, ctx, ec2, svc, awsTargets)
		checkELB(t, ctx, ec2, lb, svc)
		t.Logf("Service created to ingress hostname: %v", time.Since(start).Round(time.Millisecond))
		calls.step(t, "Service created")

		// Another port: the listener and the ELB's security group follow
		// (the CCM's sync of an existing ELB).
		svc, err := env.Client.CoreV1().Services(shop).Patch(ctx, svc.Name, types.JSONPatchType,
			[]byte(`[{"op":"replace","path":"/spec/ports/0/port","value":8080}]`), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lb = waitELBFor(t, ctx, ec2, svc, "listens on 8080", func(lb fakeec2.LoadBalancer) bool {
			return len(lb.Listeners) == 1 && lb.Listeners[0].Port == 8080
		})
		checkELB(t, ctx, ec2, lb, svc)
		calls.step(t, "port changed")

		// A node relabelled to another platform stays a target: the CCM
		// targets every node whose providerID it can parse (the sync a
		// joining node starts shows it).
		relabel(t, ctx, "aws-web-2", "metal")
		register(t, ctx, joining)
		waitELB(t, ctx, ec2, svc, []string{awsTargets[0], awsTargets[1], joining.instanceID})
		calls.step(t, "node joined")
		relabel(t, ctx, "aws-web-2", "aws")
		if err := env.Client.CoreV1().Nodes().Delete(ctx, joining.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitELB(t, ctx, ec2, svc, awsTargets)
		calls.step(t, "node left")

		deleteService(t, ctx, ec2, svc, lb)
		calls.step(t, "Service deleted")

		// Upstream ignores every Service with a class: without the gate,
		// no CCM can serve one.
		for _, s := range []*corev1.Service{awsSvc, hcloudSvc} {
			untouched(t, ctx, ec2, s)
		}
		// It saw the hcloud nodes (and left them out only because it
		// cannot parse their providerIDs).
		for _, n := range []string{"hcloud-web-1", "hcloud-web-2"} {
			if !strings.Contains(out.String(), n) {
				t.Errorf("the CCM's output never names %s: did it see every node?", n)
			}
		}
		checkCalls(t, ec2)
	})

	t.Run("Gated", func(t *testing.T) {
		ec2.Reset()
		const name = "aws-lb"
		// The fence, with the NativeCCM and its grant as an admin leaves
		// them: class hybridccm.io/aws and the default.
		rel := confineRelease(t, ctx, name, true)
		lbs := v1.LoadBalancers{Enabled: true, Class: awsClass, Default: true}
		if err := gatetest.FenceLoadBalancers(ctx, rel.client, ccmNamespace, name, lbs); err != nil {
			t.Fatal(err)
		}
		waitServiceFence(t, ctx, rel.direct, hcloudSvc)

		// ccm-gate as the coordinator's sidecar runs it for this NativeCCM.
		_, out := rel.start(t, ctx, ccmProcess{container: ccm, conf: conf, secret: secret},
			"--load-balancer-class="+awsClass, "--default-load-balancer-class")

		calls := &callLog{ec2: ec2}

		// The aws class and the default are served, with the aws nodes'
		// instances only.
		start := time.Now()
		defaultSvc := createService(t, ctx, "web-default", "")
		served := map[*corev1.Service]fakeec2.LoadBalancer{}
		for _, s := range []*corev1.Service{defaultSvc, awsSvc} {
			lb := waitELB(t, ctx, ec2, s, awsTargets)
			checkELB(t, ctx, ec2, lb, s)
			served[s] = lb
			if s == defaultSvc {
				t.Logf("Service created to ingress hostname: %v", time.Since(start).Round(time.Millisecond))
			}
		}
		calls.step(t, "Services served")

		// A node that leaves the platform leaves the targets, one that
		// joins it joins them.
		relabel(t, ctx, "aws-web-2", "metal")
		for s := range served {
			waitELB(t, ctx, ec2, s, awsTargets[:1])
		}
		calls.step(t, "node relabelled metal")
		register(t, ctx, joining)
		for s := range served {
			waitELB(t, ctx, ec2, s, []string{awsTargets[0], joining.instanceID})
		}
		calls.step(t, "node joined")
		relabel(t, ctx, "aws-web-2", "aws")
		for s := range served {
			waitELB(t, ctx, ec2, s, []string{awsTargets[0], awsTargets[1], joining.instanceID})
		}
		calls.step(t, "node relabelled aws")

		for s, lb := range served {
			deleteService(t, ctx, ec2, s, lb)
		}
		calls.step(t, "Services deleted")
		untouched(t, ctx, ec2, hcloudSvc)
		// It never saw a foreign node.
		for _, n := range lbNodes {
			if n.platform != "aws" && strings.Contains(out.String(), n.name) {
				t.Errorf("the gated CCM's output names %s, a node of platform %s", n.name, n.platform)
			}
		}
		checkCalls(t, ec2)
	})
}

// renderCCM returns the CCM container of the release the coordinator installs
// for a NativeCCM of the built-in aws profile as releaseName, with
// spec.loadBalancers as lbs (nil: lifecycle only), rendered from the profile.
func renderCCM(t *testing.T, ctx context.Context, releaseName string, lbs *release.LoadBalancerSettings) corev1.Container {
	t.Helper()
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, ok := set.Get("aws")
	if !ok {
		t.Fatal("no built-in aws profile")
	}
	_, minor := apiServerMinor(t)
	req, err := release.FromProfile(p, release.Instance{ReleaseName: releaseName, Namespace: ccmNamespace, Platform: "aws", LoadBalancers: lbs, KubernetesMinor: minor})
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := helm.NewEngine(env.Config, helm.Options{}).Render(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(manifest, "\n---") {
		var dep appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &dep); err != nil || dep.Kind != "Deployment" {
			continue
		}
		for _, c := range dep.Spec.Template.Spec.Containers {
			if c.Image != req.Upstream.Reference() {
				continue
			}
			controllers := "--controllers=cloud-node-lifecycle"
			if lbs != nil {
				controllers += ",service"
			}
			if !slices.Contains(c.Args, controllers) {
				t.Fatalf("rendered CCM args %v lack %s", c.Args, controllers)
			}
			t.Logf("rendered CCM args: %s", strings.Join(c.Args, " "))
			return c
		}
	}
	t.Fatalf("no CCM container in the rendered release:\n%s", manifest)
	return corev1.Container{}
}

// grantRelease creates the ServiceAccount sa with what the release of a
// NativeCCM binds it to — release.LifecycleRules (and its lease), with load
// balancers release.LoadBalancerRules, the delegated authentication of its
// secure port — and returns a token for it.
func grantRelease(t *testing.T, ctx context.Context, sa string, loadBalancers bool) string {
	t.Helper()
	token, err := gatetest.ServiceAccountToken(ctx, env.Client, ccmNamespace, sa)
	if err != nil {
		t.Fatal(err)
	}
	if err := gatetest.GrantLifecycle(ctx, env.Client, ccmNamespace, sa); err != nil {
		t.Fatal(err)
	}
	rbac := env.Client.RbacV1()
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ccmNamespace}}
	bindings := map[string]string{release.AuthDelegatorClusterRole: sa + release.AuthDelegatorSuffix}
	if loadBalancers {
		lbRole := sa + release.LoadBalancerSuffix
		if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: lbRole}, Rules: release.LoadBalancerRules()}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		bindings[lbRole] = lbRole
	}
	for role, binding := range bindings {
		if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: binding}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rbac.RoleBindings(release.AuthenticationReaderNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa + release.AuthenticationReaderSuffix, Namespace: release.AuthenticationReaderNamespace}, Subjects: subjects,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: release.AuthenticationReaderRole}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return token
}

// writeTokenKubeconfig writes a kubeconfig for cfg's server and trust with
// token, and returns its path.
func writeTokenKubeconfig(t *testing.T, cfg *rest.Config, token string) string {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.BearerToken, c.CertData, c.KeyData, c.CertFile, c.KeyFile = token, nil, nil, "", ""
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := gatetest.WriteKubeconfig(c, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// createService creates Service shop/name of type LoadBalancer with class
// ("" none), port 80 to 8080, and removes it when the test ends.
func createService(t *testing.T, ctx context.Context, name, class string) *corev1.Service {
	t.Helper()
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: shop}, Spec: corev1.ServiceSpec{
		Type:     corev1.ServiceTypeLoadBalancer,
		Selector: map[string]string{"app": name},
		Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}}
	if class != "" {
		s.Spec.LoadBalancerClass = &class
	}
	created, err := env.Client.CoreV1().Services(shop).Create(ctx, s, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = env.Client.CoreV1().Services(shop).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		_ = env.Client.CoreV1().Services(shop).Delete(ctx, name, metav1.DeleteOptions{})
	})
	return created
}

// elbName is the name the AWS CCM gives a Service's load balancer.
func elbName(s *corev1.Service) string { return cloudprovider.DefaultLoadBalancerName(s) }

// waitELB waits until the Service's ELB exists with exactly the instances
// want registered, and returns it.
func waitELB(t *testing.T, ctx context.Context, ec2 *fakeec2.Server, s *corev1.Service, want []string) fakeec2.LoadBalancer {
	t.Helper()
	lb := waitELBFor(t, ctx, ec2, s, fmt.Sprintf("targets %v", want), func(lb fakeec2.LoadBalancer) bool { return slices.Equal(lb.Instances, want) })
	t.Logf("Service %s/%s: ELB %s targets %v", s.Namespace, s.Name, lb.Name, lb.Instances)
	return lb
}

// waitELBFor waits until the Service's ELB exists and cond holds for it, and
// returns it.
func waitELBFor(t *testing.T, ctx context.Context, ec2 *fakeec2.Server, s *corev1.Service, what string, cond func(fakeec2.LoadBalancer) bool) fakeec2.LoadBalancer {
	t.Helper()
	var last *fakeec2.LoadBalancer
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		for _, lb := range ec2.LoadBalancers() {
			if lb.Name == elbName(s) {
				last = &lb
				return cond(lb), nil
			}
		}
		last = nil
		return false, nil
	})
	if err != nil {
		calls := strings.Join(summarize(ec2.Calls()), "\n  ")
		if last == nil {
			t.Fatalf("Service %s/%s: no ELB %s; EC2/ELB calls:\n  %s", s.Namespace, s.Name, elbName(s), calls)
		}
		t.Fatalf("Service %s/%s: ELB %s never %s: %+v; EC2/ELB calls:\n  %s", s.Namespace, s.Name, last.Name, what, *last, calls)
	}
	return *last
}

// checkELB checks the ELB of the Service against the Service: the Service
// has the ELB's DNS name as its ingress hostname and the cleanup finalizer;
// the ELB is internet-facing in the public subnet, listens on the Service's
// port for its node port, checks the node port's health, and its own
// security group admits just the port from anywhere and is admitted by the
// nodes' group.
func checkELB(t *testing.T, ctx context.Context, ec2 *fakeec2.Server, lb fakeec2.LoadBalancer, s *corev1.Service) {
	t.Helper()
	var got *corev1.Service
	poll(t, ctx, fmt.Sprintf("Service %s/%s has ingress hostname %s", s.Namespace, s.Name, lb.DNSName), func() bool {
		var err error
		got, err = env.Client.CoreV1().Services(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		return err == nil && len(got.Status.LoadBalancer.Ingress) > 0 && got.Status.LoadBalancer.Ingress[0].Hostname == lb.DNSName
	})
	if !slices.Contains(got.Finalizers, "service.kubernetes.io/load-balancer-cleanup") {
		t.Errorf("Service %s/%s finalizers %v lack the load balancer cleanup", s.Namespace, s.Name, got.Finalizers)
	}
	if class := func(s *corev1.Service) string { return ptr.Deref(s.Spec.LoadBalancerClass, "") }; class(got) != class(s) {
		t.Errorf("Service %s/%s has class %q, created with %q", s.Namespace, s.Name, class(got), class(s))
	}
	port, nodePort := got.Spec.Ports[0].Port, got.Spec.Ports[0].NodePort
	want := []fakeec2.Listener{{Protocol: "TCP", Port: port, InstanceProtocol: "TCP", InstancePort: nodePort}}
	if !slices.Equal(lb.Listeners, want) {
		t.Errorf("ELB %s listeners %+v, want %+v", lb.Name, lb.Listeners, want)
	}
	if lb.Scheme != "internet-facing" || !slices.Equal(lb.Subnets, []string{publicSubnet}) || lb.VPC != lbVPC {
		t.Errorf("ELB %s: scheme %s, subnets %v in %s; want internet-facing in [%s] of %s", lb.Name, lb.Scheme, lb.Subnets, lb.VPC, publicSubnet, lbVPC)
	}
	if hc := fmt.Sprintf("TCP:%d", nodePort); lb.HealthCheck.Target != hc {
		t.Errorf("ELB %s health check %+v, want target %s", lb.Name, lb.HealthCheck, hc)
	}
	if lb.Tags[clusterTag] != "owned" || lb.Tags["kubernetes.io/service-name"] != s.Namespace+"/"+s.Name {
		t.Errorf("ELB %s tags %v", lb.Name, lb.Tags)
	}
	if len(lb.SecurityGroups) != 1 {
		t.Fatalf("ELB %s security groups %v, want its own", lb.Name, lb.SecurityGroups)
	}
	own, nodes := group(ec2, lb.SecurityGroups[0]), group(ec2, nodeGroup)
	if own == nil || own.Name != "k8s-elb-"+lb.Name || own.Tags[clusterTag] != "owned" {
		t.Fatalf("ELB %s security group %+v, want k8s-elb-%s owned by the cluster", lb.Name, own, lb.Name)
	}
	// The Service's port, and ICMP "fragmentation needed" for path MTU
	// discovery, from anywhere (no loadBalancerSourceRanges).
	wantRules := []fakeec2.Permission{
		{Protocol: "tcp", FromPort: port, ToPort: port, CIDRs: []string{"0.0.0.0/0"}},
		{Protocol: "icmp", FromPort: 3, ToPort: 4, CIDRs: []string{"0.0.0.0/0"}},
	}
	if len(own.Ingress) != len(wantRules) || !slices.ContainsFunc(own.Ingress, func(p fakeec2.Permission) bool { return equalRule(p, wantRules[0]) }) ||
		!slices.ContainsFunc(own.Ingress, func(p fakeec2.Permission) bool { return equalRule(p, wantRules[1]) }) {
		t.Errorf("ELB %s security group ingress %+v, want %+v", lb.Name, own.Ingress, wantRules)
	}
	if !admits(nodes, own.ID) {
		t.Errorf("nodes' security group ingress %+v does not admit the ELB's group %s", nodes.Ingress, own.ID)
	}
}

func equalRule(a, b fakeec2.Permission) bool {
	return a.Protocol == b.Protocol && a.FromPort == b.FromPort && a.ToPort == b.ToPort && slices.Equal(a.CIDRs, b.CIDRs) && slices.Equal(a.Groups, b.Groups)
}

func group(ec2 *fakeec2.Server, id string) *fakeec2.SecurityGroup {
	for _, g := range ec2.SecurityGroups() {
		if g.ID == id {
			return &g
		}
	}
	return nil
}

// admits reports whether g admits all traffic from members of group src.
func admits(g *fakeec2.SecurityGroup, src string) bool {
	return g != nil && slices.ContainsFunc(g.Ingress, func(p fakeec2.Permission) bool {
		return p.Protocol == "-1" && slices.Contains(p.Groups, src)
	})
}

// deleteService deletes the Service and waits until it is gone (the CCM
// removed its finalizer), then checks that its ELB and the ELB's security
// group are gone and the nodes' group no longer admits that group.
func deleteService(t *testing.T, ctx context.Context, ec2 *fakeec2.Server, s *corev1.Service, lb fakeec2.LoadBalancer) {
	t.Helper()
	if err := env.Client.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, fmt.Sprintf("Service %s/%s gone", s.Namespace, s.Name), func() bool {
		_, err := env.Client.CoreV1().Services(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if slices.ContainsFunc(ec2.LoadBalancers(), func(l fakeec2.LoadBalancer) bool { return l.Name == lb.Name }) {
		t.Errorf("Service %s/%s gone, its ELB %s is not", s.Namespace, s.Name, lb.Name)
	}
	poll(t, ctx, fmt.Sprintf("security group %s of ELB %s deleted", lb.SecurityGroups[0], lb.Name), func() bool {
		return group(ec2, lb.SecurityGroups[0]) == nil
	})
	if nodes := group(ec2, nodeGroup); admits(nodes, lb.SecurityGroups[0]) {
		t.Errorf("nodes' security group still admits %s: %+v", lb.SecurityGroups[0], nodes.Ingress)
	}
	t.Logf("Service %s/%s deleted: ELB %s and security group %s gone", s.Namespace, s.Name, lb.Name, lb.SecurityGroups[0])
}

// untouched checks that no CCM served the Service: no status, no finalizer,
// no ELB, no call naming its ELB.
func untouched(t *testing.T, ctx context.Context, ec2 *fakeec2.Server, s *corev1.Service) {
	t.Helper()
	got, err := env.Client.CoreV1().Services(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != s.ResourceVersion || len(got.Status.LoadBalancer.Ingress) > 0 || len(got.Finalizers) > 0 {
		t.Errorf("Service %s/%s of class %s was changed: finalizers %v, status %+v", s.Namespace, s.Name, *s.Spec.LoadBalancerClass, got.Finalizers, got.Status)
	}
	for _, c := range ec2.Calls() {
		if c.Resource == elbName(s) {
			t.Errorf("Service %s/%s of class %s: call %s", s.Namespace, s.Name, *s.Spec.LoadBalancerClass, c)
		}
	}
}

// checkCalls logs the CCM's calls to the fake and checks that it answered
// them all (no action it does not know, no metadata request), signed with
// the Secret's key for the configured region.
func checkCalls(t *testing.T, ec2 *fakeec2.Server) {
	t.Helper()
	calls := ec2.Calls()
	t.Logf("the AWS CCM's calls to the fake EC2 and ELB APIs (%d):\n  %s", len(calls), strings.Join(summarize(calls), "\n  "))
	for _, c := range ec2.Unknown() {
		t.Errorf("the fake does not answer %s %s", c.Service, c.Action)
	}
	for _, c := range calls {
		if c.Service == fakeec2.IMDS {
			t.Errorf("metadata request %s", c)
			continue
		}
		if c.AccessKey != accessKey || c.Region != region || c.SignedRegion != region {
			t.Errorf("call %s sent to region %q signed by %q for %q, want the Secret's key %q for %q", c, c.Region, c.AccessKey, c.SignedRegion, accessKey, region)
		}
	}
}

// callLog logs the calls of each step.
type callLog struct {
	ec2  *fakeec2.Server
	seen int
}

func (l *callLog) step(t *testing.T, what string) {
	t.Helper()
	calls := l.ec2.Calls()
	t.Logf("%s: %d calls\n  %s", what, len(calls)-l.seen, strings.Join(summarize(calls[l.seen:]), "\n  "))
	l.seen = len(calls)
}

// relabel moves a node to another platform, as an admin relabelling it would.
func relabel(t *testing.T, ctx context.Context, name, platform string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, platformLb, platform)
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitServiceFence waits until the fence denies the CCM (cfg) a dry-run write
// of the foreign Service's status, naming the gate.
func waitServiceFence(t *testing.T, ctx context.Context, cfg *rest.Config, s *corev1.Service) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"status":{"loadBalancer":{"ingress":[{"hostname":"stolen.example"}]}}}`)
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = cs.CoreV1().Services(s.Namespace).Patch(ctx, s.Name, types.StrategicMergePatchType, patch,
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
		return apierrors.IsForbidden(last) && strings.Contains(last.Error(), "hybrid-ccm gate"), nil
	})
	if err != nil {
		t.Fatalf("the fence never denied the CCM the status of Service %s/%s: %v", s.Namespace, s.Name, last)
	}
	t.Logf("fence: %v", last)
}
