package proxy_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	cloudprovider "k8s.io/cloud-provider"
	servicecontroller "k8s.io/cloud-provider/controllers/service"
	controllersmetrics "k8s.io/component-base/metrics/prometheus/controllers"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
)

// lbCloud is a cloud with load balancers and nothing else: each load balancer
// belongs to one Service (by uid, as real clouds name them), gets an address
// from the cloud's range and targets the nodes it was last given.
type lbCloud struct {
	name string
	// prefix of the addresses it hands out.
	prefix string
	// t fails the test when a Service reaches the cloud with a class: the
	// view must present every Service without one.
	t *testing.T

	mu  sync.Mutex
	lbs map[types.UID]*lb
	// asked counts the calls per Service (namespace/name).
	asked map[string]int
	// deleted are the Services whose load balancer was deleted.
	deleted []string
	next    int
}

type lb struct {
	service string
	ip      string
	hosts   []string
}

var (
	_ cloudprovider.Interface    = (*lbCloud)(nil)
	_ cloudprovider.LoadBalancer = (*lbCloud)(nil)
)

func newLBCloud(t *testing.T, name, prefix string) *lbCloud {
	return &lbCloud{t: t, name: name, prefix: prefix, lbs: map[types.UID]*lb{}, asked: map[string]int{}}
}

func (c *lbCloud) ask(s *corev1.Service) {
	if s.Spec.LoadBalancerClass != nil {
		c.t.Errorf("%s cloud got Service %s/%s with class %q", c.name, s.Namespace, s.Name, *s.Spec.LoadBalancerClass)
	}
	c.asked[s.Namespace+"/"+s.Name]++
}

func hostNames(nodes []*corev1.Node) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out
}

func (c *lbCloud) GetLoadBalancer(_ context.Context, _ string, s *corev1.Service) (*corev1.LoadBalancerStatus, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ask(s)
	l, ok := c.lbs[s.UID]
	if !ok {
		return nil, false, nil
	}
	return &corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: l.ip}}}, true, nil
}

func (c *lbCloud) GetLoadBalancerName(_ context.Context, _ string, s *corev1.Service) string {
	return "a" + string(s.UID)
}

func (c *lbCloud) EnsureLoadBalancer(_ context.Context, _ string, s *corev1.Service, nodes []*corev1.Node) (*corev1.LoadBalancerStatus, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ask(s)
	l, ok := c.lbs[s.UID]
	if !ok {
		c.next++
		l = &lb{service: s.Namespace + "/" + s.Name, ip: fmt.Sprintf("%s%d", c.prefix, c.next)}
		c.lbs[s.UID] = l
	}
	l.hosts = hostNames(nodes)
	return &corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: l.ip}}}, nil
}

func (c *lbCloud) UpdateLoadBalancer(_ context.Context, _ string, s *corev1.Service, nodes []*corev1.Node) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ask(s)
	if l, ok := c.lbs[s.UID]; ok {
		l.hosts = hostNames(nodes)
	}
	return nil
}

func (c *lbCloud) EnsureLoadBalancerDeleted(_ context.Context, _ string, s *corev1.Service) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ask(s)
	if _, ok := c.lbs[s.UID]; ok {
		delete(c.lbs, s.UID)
		c.deleted = append(c.deleted, s.Namespace+"/"+s.Name)
	}
	return nil
}

// hosts returns the targets of the Service's load balancer (ok: it has one).
func (c *lbCloud) hosts(service string) ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lbs {
		if l.service == service {
			return slices.Clone(l.hosts), true
		}
	}
	return nil, false
}

// services returns the Services the cloud was asked about.
func (c *lbCloud) services() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for s := range c.asked {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func (c *lbCloud) wasDeleted(service string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.deleted, service)
}

func (c *lbCloud) Initialize(cloudprovider.ControllerClientBuilder, <-chan struct{}) {}
func (c *lbCloud) LoadBalancer() (cloudprovider.LoadBalancer, bool)                  { return c, true }
func (c *lbCloud) Instances() (cloudprovider.Instances, bool)                        { return nil, false }
func (c *lbCloud) InstancesV2() (cloudprovider.InstancesV2, bool)                    { return nil, false }
func (c *lbCloud) Zones() (cloudprovider.Zones, bool)                                { return nil, false }
func (c *lbCloud) Clusters() (cloudprovider.Clusters, bool)                          { return nil, false }
func (c *lbCloud) Routes() (cloudprovider.Routes, bool)                              { return nil, false }
func (c *lbCloud) ProviderName() string                                              { return c.name }
func (c *lbCloud) HasClusterID() bool                                                { return true }

// runServiceController runs the unmodified service controller of
// k8s.io/cloud-provider with cloud against cfg (a gate, or the API server
// itself) until the test ends, with the CCM's default protobuf encoding.
func runServiceController(t *testing.T, cfg *rest.Config, cloud cloudprovider.Interface) (stop func()) {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs := kubernetes.NewForConfigOrDie(cfg)
	factory := informers.NewSharedInformerFactory(cs, 0)
	ctrl, err := servicecontroller.New(cloud, cs, factory.Core().V1().Services(), factory.Core().V1().Nodes(), "hybrid", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctrl.Run(ctx, 2, controllersmetrics.NewControllerManagerMetrics("gate-test"))
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			factory.Shutdown()
		})
	}
	t.Cleanup(stop)
	return stop
}

// eventually polls cond for up to 30 s.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		ok, state := cond()
		last = state
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: %s", what, last)
	}
}

// TestServiceControllerBehindGates runs the real service controller of
// k8s.io/cloud-provider for two clouds, each behind its own gate, with a fake
// load-balancer cloud each: every Service gets its address from the cloud of
// its class, every load balancer targets that cloud's nodes only, and the
// Services of other classes are never touched. Run without a gate first, the
// same controller is the proof that the test can fail.
func TestServiceControllerBehindGates(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const (
		awsPlatform, hcPlatform = "lbc-aws", "lbc-hc"
		otherClass              = "other.example.com/lb"
	)
	fixture(t, "lbc",
		gatetest.NodeSpec{Name: "lbc-aws-1", Platform: awsPlatform, ProviderID: "aws:///a/i-1", Ready: true},
		gatetest.NodeSpec{Name: "lbc-aws-2", Platform: awsPlatform, ProviderID: "aws:///a/i-2", Ready: true},
		gatetest.NodeSpec{Name: "lbc-hc-1", Platform: hcPlatform, ProviderID: "hcloud://1", Ready: true},
		gatetest.NodeSpec{Name: "lbc-hc-2", Platform: hcPlatform, ProviderID: "hcloud://2", Ready: true,
			Labels: map[string]string{corev1.LabelNodeExcludeBalancers: "true"}},
		gatetest.NodeSpec{Name: "lbc-uninit", Ready: true},
	)
	setWatchList(t, true)

	t.Run("ungated", func(t *testing.T) {
		const ns = "lbc-ungated"
		serviceFixture(t, ns, svcSpec{name: "web-aws", class: ptr.To(awsClass)}, svcSpec{name: "web"})
		cloud := newLBCloud(t, "aws", "198.51.100.")
		stop := runServiceController(t, ccmConfig, cloud)
		eventually(t, "the ungated controller serves the classless Service", func() (bool, string) {
			hosts, ok := cloud.hosts(ns + "/web")
			return ok && slices.Contains(hosts, "lbc-hc-1") && slices.Contains(hosts, "lbc-uninit"), fmt.Sprint(hosts)
		})
		stop()
		// Upstream, a CCM serves only classless Services, with every node of
		// the cluster as a target, whatever its cloud.
		if slices.Contains(cloud.services(), ns+"/web-aws") {
			t.Fatal("the ungated controller served a Service with a class")
		}
		deleteServices(t, ns)
	})

	const ns = "lbc"
	serviceFixture(t, ns,
		svcSpec{name: "web-aws", class: ptr.To(awsClass)},
		svcSpec{name: "web-hc", class: ptr.To(ownClass)},
		svcSpec{name: "web-default"},
		svcSpec{name: "web-other", class: ptr.To(otherClass)},
		svcSpec{name: "internal", typ: corev1.ServiceTypeClusterIP},
	)
	awsGate := startGate(t, awsPlatform, func(c *proxy.Config) { c.LoadBalancerClass = awsClass })
	hcGate := startGate(t, hcPlatform, func(c *proxy.Config) { c.LoadBalancerClass, c.DefaultLoadBalancerClass = ownClass, true })
	aws := newLBCloud(t, "aws", "198.51.100.")
	hc := newLBCloud(t, "hcloud", "203.0.113.")
	runServiceController(t, awsGate.config(), aws)
	runServiceController(t, hcGate.config(), hc)

	admin := env.Client.CoreV1().Services(ns)
	served := func(name string, cloud *lbCloud, class *string, wantHosts ...string) {
		t.Helper()
		eventually(t, name+" served by "+cloud.name, func() (bool, string) {
			s, err := admin.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			hosts, _ := cloud.hosts(ns + "/" + name)
			ingress := s.Status.LoadBalancer.Ingress
			ok := len(ingress) == 1 && len(ingress[0].IP) > len(cloud.prefix) && ingress[0].IP[:len(cloud.prefix)] == cloud.prefix &&
				slices.Contains(s.Finalizers, service.LoadBalancerCleanupFinalizer) && slices.Equal(hosts, wantHosts)
			return ok, fmt.Sprintf("ingress %v, finalizers %v, hosts %v (want %v)", ingress, s.Finalizers, hosts, wantHosts)
		})
		s, _ := admin.Get(ctx, name, metav1.GetOptions{})
		if !ptrEqual(s.Spec.LoadBalancerClass, class) {
			t.Fatalf("%s: class %v after the controller's writes, want %v", name, s.Spec.LoadBalancerClass, class)
		}
	}
	served("web-aws", aws, ptr.To(awsClass), "lbc-aws-1", "lbc-aws-2")
	served("web-hc", hc, ptr.To(ownClass), "lbc-hc-1")
	served("web-default", hc, nil, "lbc-hc-1")

	t.Run("other Services are never touched", func(t *testing.T) {
		// A write to any Service reaches both controllers' informers after
		// the ones before it: once this one is served, the others would be.
		if _, err := admin.Create(ctx, svcSpec{name: "web-marker", class: ptr.To(awsClass)}.service(ns), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		served("web-marker", aws, ptr.To(awsClass), "lbc-aws-1", "lbc-aws-2")
		for _, name := range []string{"web-other", "internal"} {
			s, err := admin.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Finalizers) > 0 || len(s.Status.LoadBalancer.Ingress) > 0 {
				t.Fatalf("%s touched: finalizers %v, status %+v", name, s.Finalizers, s.Status)
			}
		}
		if got, want := aws.services(), []string{ns + "/web-aws", ns + "/web-marker"}; !slices.Equal(got, want) {
			t.Fatalf("aws cloud asked about %v, want %v", got, want)
		}
		if got, want := hc.services(), []string{ns + "/web-default", ns + "/web-hc"}; !slices.Equal(got, want) {
			t.Fatalf("hcloud cloud asked about %v, want %v", got, want)
		}
	})

	t.Run("a node joining and leaving a platform changes only its targets", func(t *testing.T) {
		if err := gatetest.CreateNodes(ctx, env.Client, gatetest.NodeSpec{Name: "lbc-aws-3", Platform: awsPlatform, ProviderID: "aws:///a/i-3", Ready: true,
			Labels: map[string]string{"gatetest": "lbc"}}); err != nil {
			t.Fatal(err)
		}
		served("web-aws", aws, ptr.To(awsClass), "lbc-aws-1", "lbc-aws-2", "lbc-aws-3")
		// Moved to hcloud (as talos-ccm would, for a reinstalled machine).
		if _, err := env.Client.CoreV1().Nodes().Patch(ctx, "lbc-aws-3", types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"`+platformLabel+`":"`+hcPlatform+`"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		served("web-aws", aws, ptr.To(awsClass), "lbc-aws-1", "lbc-aws-2")
		served("web-hc", hc, ptr.To(ownClass), "lbc-aws-3", "lbc-hc-1")
		if err := env.Client.CoreV1().Nodes().Delete(ctx, "lbc-aws-3", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		served("web-hc", hc, ptr.To(ownClass), "lbc-hc-1")
		served("web-aws", aws, ptr.To(awsClass), "lbc-aws-1", "lbc-aws-2")
	})

	gone := func(name string, cloud *lbCloud) {
		t.Helper()
		eventually(t, name+"'s load balancer deleted by "+cloud.name, func() (bool, string) {
			s, err := admin.Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				return cloud.wasDeleted(ns + "/" + name), "Service gone"
			case err != nil:
				return false, err.Error()
			}
			_, has := cloud.hosts(ns + "/" + name)
			return !has && len(s.Finalizers) == 0 && len(s.Status.LoadBalancer.Ingress) == 0 && cloud.wasDeleted(ns+"/"+name),
				fmt.Sprintf("load balancer %v, finalizers %v, status %+v", has, s.Finalizers, s.Status)
		})
	}
	t.Run("a Service that stops being a LoadBalancer loses its load balancer", func(t *testing.T) {
		if _, err := admin.Patch(ctx, "web-hc", types.MergePatchType, []byte(`{"spec":{"type":"ClusterIP"}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		gone("web-hc", hc)
		if aws.wasDeleted(ns + "/web-hc") {
			t.Fatal("the aws cloud was asked to delete an hcloud load balancer")
		}
	})
	t.Run("a deleted Service loses its load balancer, then its finalizer", func(t *testing.T) {
		if err := admin.Delete(ctx, "web-aws", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		gone("web-aws", aws)
		eventually(t, "web-aws gone", func() (bool, string) {
			_, err := admin.Get(ctx, "web-aws", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	})
	t.Run("class preserved", func(t *testing.T) {
		if s, err := admin.Get(ctx, "web-other", metav1.GetOptions{}); err != nil || !ptrEqual(s.Spec.LoadBalancerClass, ptr.To(otherClass)) {
			t.Fatalf("web-other: %v %v", s.Spec.LoadBalancerClass, err)
		}
		if s, err := admin.Get(ctx, "web-marker", metav1.GetOptions{}); err != nil || !ptrEqual(s.Spec.LoadBalancerClass, ptr.To(awsClass)) {
			t.Fatalf("web-marker: %v %v", s.Spec.LoadBalancerClass, err)
		}
	})
}

func ptrEqual(a, b *string) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}
