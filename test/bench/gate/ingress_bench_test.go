package gate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	cloudprovider "k8s.io/cloud-provider"
	servicecontroller "k8s.io/cloud-provider/controllers/service"
	controllersmetrics "k8s.io/component-base/metrics/prometheus/controllers"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
)

const (
	ingressNS = "bench-ingress"
	// ingressClass is served by a ccm-gate of its own, so that the 5000
	// Services of the list benchmarks are not in its controller's view.
	ingressClass = "hybridccm.io/bench-ingress"
	// ingressRuns Services one at a time per path; ingressBursts bursts of
	// ingressBurst Services created at once per path.
	ingressRuns   = 40
	ingressBursts = 5
	ingressBurst  = 100
	// ingressWorkers is the service controller's --concurrent-service-syncs
	// (upstream's default).
	ingressWorkers = 1
)

// ingressSeq numbers the benchmark's Services.
var ingressSeq int

// instantCloud is a load-balancer cloud that answers at once: an address per
// Service uid. The benchmark measures the path between the API server and
// the service controller, not a cloud.
type instantCloud struct {
	mu  sync.Mutex
	ips map[types.UID]string
}

var _ cloudprovider.LoadBalancer = (*instantCloud)(nil)

func (c *instantCloud) status(s *corev1.Service, create bool) *corev1.LoadBalancerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	ip, ok := c.ips[s.UID]
	if !ok && create {
		ip = fmt.Sprintf("198.51.%d.%d", len(c.ips)/250, len(c.ips)%250+1)
		c.ips[s.UID] = ip
	}
	if ip == "" {
		return nil
	}
	return &corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: ip}}}
}

func (c *instantCloud) GetLoadBalancer(_ context.Context, _ string, s *corev1.Service) (*corev1.LoadBalancerStatus, bool, error) {
	st := c.status(s, false)
	return st, st != nil, nil
}
func (c *instantCloud) GetLoadBalancerName(_ context.Context, _ string, s *corev1.Service) string {
	return "lb-" + string(s.UID)
}
func (c *instantCloud) EnsureLoadBalancer(_ context.Context, _ string, s *corev1.Service, _ []*corev1.Node) (*corev1.LoadBalancerStatus, error) {
	return c.status(s, true), nil
}
func (c *instantCloud) UpdateLoadBalancer(context.Context, string, *corev1.Service, []*corev1.Node) error {
	return nil
}
func (c *instantCloud) EnsureLoadBalancerDeleted(_ context.Context, _ string, s *corev1.Service) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.ips, s.UID)
	return nil
}

// instantProvider is the cloud with load balancers and nothing else.
type instantProvider struct{ lbs *instantCloud }

func (p instantProvider) Initialize(cloudprovider.ControllerClientBuilder, <-chan struct{}) {}
func (p instantProvider) LoadBalancer() (cloudprovider.LoadBalancer, bool)                  { return p.lbs, true }
func (p instantProvider) Instances() (cloudprovider.Instances, bool)                        { return nil, false }
func (p instantProvider) InstancesV2() (cloudprovider.InstancesV2, bool)                    { return nil, false }
func (p instantProvider) Zones() (cloudprovider.Zones, bool)                                { return nil, false }
func (p instantProvider) Clusters() (cloudprovider.Clusters, bool)                          { return nil, false }
func (p instantProvider) Routes() (cloudprovider.Routes, bool)                              { return nil, false }
func (p instantProvider) ProviderName() string                                              { return "bench" }
func (p instantProvider) HasClusterID() bool                                                { return true }

// startServiceController runs k8s.io/cloud-provider's unmodified service
// controller against cfg as a CCM does (protobuf, its own informers) and
// waits for its caches.
func startServiceController(ctx context.Context, cfg *rest.Config) error {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(cs, 0)
	cloud := instantProvider{lbs: &instantCloud{ips: map[types.UID]string{}}}
	ctrl, err := servicecontroller.New(cloud, cs, factory.Core().V1().Services(), factory.Core().V1().Nodes(), "bench", nil)
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("service controller: %v informer never synced", typ)
		}
	}
	go ctrl.Run(ctx, ingressWorkers, controllersmetrics.NewControllerManagerMetrics("bench-"+cfg.Host))
	return nil
}

// ingressWatch tells when Services get an ingress address, as a client
// waiting for its load balancer sees it (a watch of the API server).
type ingressWatch struct {
	mu      sync.Mutex
	waiting map[string]chan struct{}
}

func watchIngress(ctx context.Context, cs kubernetes.Interface) (*ingressWatch, error) {
	w, err := cs.CoreV1().Services(ingressNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	iw := &ingressWatch{waiting: map[string]chan struct{}{}}
	go func() {
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*corev1.Service)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) || len(s.Status.LoadBalancer.Ingress) == 0 {
				continue
			}
			iw.mu.Lock()
			if ch, ok := iw.waiting[s.Name]; ok {
				close(ch)
				delete(iw.waiting, s.Name)
			}
			iw.mu.Unlock()
		}
	}()
	return iw, nil
}

// expect returns a channel closed once Service name has an address; call it
// before creating the Service.
func (iw *ingressWatch) expect(name string) <-chan struct{} {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	ch := make(chan struct{})
	iw.waiting[name] = ch
	return ch
}

func ingressService(name string, class *string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ingressNS},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: class,
			AllocateLoadBalancerNodePorts: ptr.To(false),
			Selector:                      map[string]string{"app": name},
			Ports:                         []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// BenchmarkServiceIngress measures the time from creating a LoadBalancer
// Service to its ingress address, with the real service controller of
// k8s.io/cloud-provider and an instant cloud, in the same run: directly (the
// controller serves classless Services, as upstream does) and through
// ccm-gate (it serves the gate's class, presented without it). One Service
// at a time, then bursts of ingressBurst created at once.
func BenchmarkServiceIngress(b *testing.B) {
	f := setupServices(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := env.Client.CoreV1().Services(ingressNS)
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ingressNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	// Targets of the platform, seen by both controllers.
	var targets []gatetest.NodeSpec
	for i := range 3 {
		targets = append(targets, gatetest.NodeSpec{Name: fmt.Sprintf("ingress-%d", i), Platform: platform, ProviderID: fmt.Sprintf("hcloud://9%04d", i), Ready: true,
			Labels: map[string]string{"bench": "ingress"}})
	}
	if err := gatetest.CreateNodes(ctx, env.Client, targets...); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	// The node benchmarks count the platform's nodes.
	defer func() {
		if err := gatetest.DeleteNodes(context.Background(), env.Client, "bench=ingress"); err != nil {
			b.Error(err)
		}
	}()
	g, err := gatetest.StartGate(bin, mkdir(b, filepath.Join(workDir, "ingress")), platform, f.direct, f.direct.BearerToken, "--load-balancer-class="+ingressClass)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Stop()
	watchMemory(g)
	defer forgetMemory(g)
	if err := startServiceController(ctx, f.direct); err != nil {
		b.Fatal(err)
	}
	if err := startServiceController(ctx, g.Config); err != nil {
		b.Fatal(err)
	}
	iw, err := watchIngress(ctx, env.Client)
	if err != nil {
		b.Fatal(err)
	}
	// The helpers below fail the (sub-)benchmark they run in, tb.
	wait := func(tb testing.TB, chs ...<-chan struct{}) {
		timeout := time.After(2 * time.Minute)
		for _, ch := range chs {
			select {
			case <-ch:
			case <-timeout:
				tb.Fatalf("a Service got no address within 2 minutes; ccm-gate log: %s", g.Log)
			}
		}
	}
	// Every Service gets a new name, however often -count and the
	// benchmark framework call the functions below.
	next := func(kind string) string {
		ingressSeq++
		return fmt.Sprintf("%s-%05d", kind, ingressSeq)
	}
	// One Service at a time: the latency a user sees.
	serve := func(tb testing.TB, kind string, class *string) time.Duration {
		name := next(kind)
		ch := iw.expect(name)
		start := time.Now()
		if _, err := admin.Create(ctx, ingressService(name, class), metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
		wait(tb, ch)
		return time.Since(start)
	}
	// A burst: the time until the last of n has its address.
	burst := func(tb testing.TB, kind string, class *string) time.Duration {
		names := make([]string, ingressBurst)
		chs := make([]<-chan struct{}, ingressBurst)
		for i := range chs {
			names[i] = next(kind)
			chs[i] = iw.expect(names[i])
		}
		start := time.Now()
		if err := gatetest.Parallel(ingressBurst, 16, func(i int) error {
			_, err := admin.Create(ctx, ingressService(names[i], class), metav1.CreateOptions{})
			return err
		}); err != nil {
			tb.Fatal(err)
		}
		wait(tb, chs...)
		return time.Since(start)
	}
	// Both controllers serve once before anything is timed.
	serve(b, "warm-direct", nil)
	serve(b, "warm-gate", ptr.To(ingressClass))
	b.Run("one-at-a-time", func(b *testing.B) {
		for range b.N {
			var d, gt []time.Duration
			for range ingressRuns {
				d = append(d, serve(b, "one-direct", nil))
				gt = append(gt, serve(b, "one-gate", ptr.To(ingressClass)))
			}
			report(b, "Service creation to ingress address, one at a time", d, gt)
		}
	})
	b.Run(fmt.Sprintf("burst-%d", ingressBurst), func(b *testing.B) {
		for range b.N {
			var d, gt []time.Duration
			for range ingressBursts {
				d = append(d, burst(b, "burst-direct", nil))
				gt = append(gt, burst(b, "burst-gate", ptr.To(ingressClass)))
			}
			report(b, fmt.Sprintf("%d Services created at once to the last ingress address", ingressBurst), d, gt)
		}
	})
	b.Run("rss", func(b *testing.B) {
		for range b.N {
			reportMemory(b, g, "the ingress gate")
		}
	})
}

func mkdir(b *testing.B, dir string) string {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	return dir
}
