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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
)

const (
	// services of the gate's class in serviceNS: all in the view (the worst
	// case for the gate, which copies every one without its class) and the
	// same Services the direct list returns.
	services   = 5000
	serviceNS  = "bench-services"
	benchClass = "hybridccm.io/hcloud"
	// serviceEvents are Service updates streamed to both watchers.
	serviceEvents = 1000
)

// serviceFixture is a second ccm-gate process, with the Service view on,
// in front of the same API server with 5000 Services.
type serviceFixture struct {
	direct, gated *rest.Config
	gate          *gatetest.Gate
	// candidate is a second gate of the same configuration built from other
	// code (GATE_BENCH_CANDIDATE names its binary; nil: none), timed in the
	// same rotation as the first.
	candidate       *gatetest.Gate
	candidateConfig *rest.Config
}

var (
	servicesOnce   sync.Once
	sharedServices *serviceFixture
	servicesErr    error
)

func setupServices(b *testing.B) *serviceFixture {
	b.Helper()
	servicesOnce.Do(func() { sharedServices, servicesErr = startServices(filepath.Join(workDir, "services")) })
	if servicesErr != nil {
		b.Fatal(servicesErr)
	}
	return sharedServices
}

func startServices(dir string) (*serviceFixture, error) {
	ctx := context.Background()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := gatetest.GrantNativeCCM(ctx, env.Client, ccmNS, ccmName); err != nil {
		return nil, err
	}
	if err := gatetest.GrantLoadBalancers(ctx, env.Client, ccmNS, ccmName); err != nil {
		return nil, err
	}
	token, err := gatetest.ServiceAccountToken(ctx, env.Client, ccmNS, ccmName)
	if err != nil {
		return nil, err
	}
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: serviceNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if err := createServices(ctx, env.Client); err != nil {
		return nil, err
	}
	direct := &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: token, QPS: -1, Burst: -1}
	g, err := gatetest.StartGate(bin, dir, platform, direct, token, "--load-balancer-class="+benchClass)
	if err != nil {
		return nil, err
	}
	watchMemory(g)
	f := &serviceFixture{direct: direct, gated: g.Config, gate: g}
	if other := os.Getenv("GATE_BENCH_CANDIDATE"); other != "" {
		dir := filepath.Join(dir, "candidate")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		c, err := gatetest.StartGate(other, dir, platform, direct, token, "--load-balancer-class="+benchClass)
		if err != nil {
			g.Stop()
			return nil, fmt.Errorf("candidate %s: %w", other, err)
		}
		watchMemory(c)
		f.candidate, f.candidateConfig = c, c.Config
	}
	return f, nil
}

// candidateRun returns run for the candidate gate's client, nil without one.
func (f *serviceFixture) candidateRun(contentType string, run func(kubernetes.Interface) func() time.Duration) func() time.Duration {
	if f.candidate == nil {
		return nil
	}
	return run(clientIn(f.candidateConfig, contentType))
}

// benchService is a LoadBalancer Service as a CCM serves it: a port, a
// selector, a finalizer and an address. It takes no node port, not even for
// health checks (the range would not hold 5000).
func benchService(i int) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("svc-%05d", i), Namespace: serviceNS,
			Labels:     map[string]string{"app": fmt.Sprintf("app-%05d", i), "tier": "web"},
			Finalizers: []string{"service.kubernetes.io/load-balancer-cleanup"},
		},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(benchClass),
			AllocateLoadBalancerNodePorts: ptr.To(false),
			Selector:                      map[string]string{"app": fmt.Sprintf("app-%05d", i)},
			Ports:                         []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(8443), Protocol: corev1.ProtocolTCP}},
		},
	}
}

func createServices(ctx context.Context, cs kubernetes.Interface) error {
	return gatetest.Parallel(services, 16, func(i int) error {
		s, err := cs.CoreV1().Services(serviceNS).Create(ctx, benchService(i), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create Service %d: %w", i, err)
		}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("203.0.%d.%d", i/250, i%250+1)}}
		if _, err := cs.CoreV1().Services(serviceNS).UpdateStatus(ctx, s, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("status of Service %d: %w", i, err)
		}
		return nil
	})
}

func clientIn(cfg *rest.Config, contentType string) kubernetes.Interface {
	c := rest.CopyConfig(cfg)
	c.ContentType, c.AcceptContentTypes = contentType, contentType
	return kubernetes.NewForConfigOrDie(c)
}

var encodings = []struct{ name, contentType string }{
	{"protobuf", "application/vnd.kubernetes.protobuf"},
	{"json", "application/json"},
}

// BenchmarkServiceList5000 lists the 5000 Services directly and through the
// gate (which reads every one and copies it without its class), alternating,
// as protobuf and JSON.
func BenchmarkServiceList5000(b *testing.B) {
	f := setupServices(b)
	ctx := context.Background()
	for _, enc := range encodings {
		b.Run(enc.name, func(b *testing.B) {
			direct, gated := clientIn(f.direct, enc.contentType), clientIn(f.gated, enc.contentType)
			list := func(cs kubernetes.Interface, wantClass bool) func() time.Duration {
				return func() time.Duration {
					start := time.Now()
					l, err := cs.CoreV1().Services(serviceNS).List(ctx, metav1.ListOptions{})
					d := time.Since(start)
					if err != nil || len(l.Items) != services || (l.Items[0].Spec.LoadBalancerClass != nil) != wantClass {
						b.Fatalf("list: %d Services, %v", len(l.Items), err)
					}
					return d
				}
			}
			alternateWith(b, fmt.Sprintf("list %d Services (%s)", services, enc.name), lists, list(direct, true), list(gated, false),
				f.candidateRun(enc.contentType, func(cs kubernetes.Interface) func() time.Duration { return list(cs, false) }))
		})
	}
}

// BenchmarkServiceWatch times a WatchList's initial events for the 5000
// Services (what the service controller's informer does at start) directly
// and through the gate, and streams Service updates to two watchers at once.
func BenchmarkServiceWatch(b *testing.B) {
	f := setupServices(b)
	ctx := context.Background()
	for _, enc := range encodings {
		b.Run("initial-events/"+enc.name, func(b *testing.B) {
			direct, gated := clientIn(f.direct, enc.contentType), clientIn(f.gated, enc.contentType)
			open := func(cs kubernetes.Interface) func() time.Duration {
				return func() time.Duration { return initialEvents(b, services, "", cs.CoreV1().Services(serviceNS).Watch) }
			}
			alternateWith(b, fmt.Sprintf("WatchList initial events for %d Services (%s)", services, enc.name), initialRuns,
				open(direct), open(gated), f.candidateRun(enc.contentType, open))
		})
	}

	b.Run("updates", func(b *testing.B) {
		direct, gated := clientIn(f.direct, encodings[0].contentType), clientIn(f.gated, encodings[0].contentType)
		for range b.N {
			l, err := direct.CoreV1().Services(serviceNS).List(ctx, metav1.ListOptions{Limit: 1})
			if err != nil {
				b.Fatal(err)
			}
			open := func(cs kubernetes.Interface) watch.Interface {
				w, err := cs.CoreV1().Services(serviceNS).Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
				if err != nil {
					b.Fatal(err)
				}
				return w
			}
			wd, wg := open(direct), open(gated)
			updateLatency(b, wd, wg, serviceEvents, "Service", func(i int, patch []byte) error {
				_, err := env.Client.CoreV1().Services(serviceNS).Patch(ctx, fmt.Sprintf("svc-%05d", i%services), types.MergePatchType, patch, metav1.PatchOptions{})
				return err
			})
		}
	})
	b.Run("rss", func(b *testing.B) {
		for range b.N {
			reportMemory(b, f.gate, fmt.Sprintf("%d Services in the view", services))
			if f.candidate != nil {
				reportMemory(b, f.candidate, fmt.Sprintf("candidate, %d Services in the view", services))
			}
		}
	})
}
