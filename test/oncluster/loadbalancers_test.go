package oncluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakelb"
)

// lbNamespace holds the LoadBalancer Services of loadBalancers.
const lbNamespace = "shop"

// loadBalancers creates LoadBalancer Services of each class the install
// serves (testdata/multi-cloud.yaml: hcloud and the first aws region's CCM
// serve load balancers, that one also Services without a class; gcp serves
// none) and checks what the clouds built: one load balancer per served
// Service, in the cloud of its class, its address on the Service, targeting
// exactly the nodes of the domain of the CCM that serves it
// (the real AWS CCM a Classic ELB in the fake EC2 with the nodes'
// instances, the hcloud stand-in one of test/fakelb); a Service of a class
// nobody serves untouched; deleting a Service removes its load balancer and
// then the finalizer.
func loadBalancers(t *testing.T, ctx context.Context) {
	if _, err := f.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lbNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	services := []struct {
		name  string
		class *string
		// cloud is the provider that must serve it ("" none), nodes the
		// selector of the nodes its load balancer targets: its CCM's
		// domain (aws: the first region's NativeCCM serves the class).
		cloud, nodes string
	}{
		{"web-hcloud", ptr.To("hybridccm.io/hcloud"), "hcloud", names.PlatformLabel + "=hcloud"},
		{"web-aws", ptr.To("hybridccm.io/aws"), "aws", awsDomain},
		{"web-default", nil, "aws", awsDomain},
		// gcp's NativeCCM has no load balancers: nobody serves its class
		{"web-gcp", ptr.To("hybridccm.io/gcp"), "", ""},
	}
	for _, s := range services {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: lbNamespace},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: s.class,
				Selector: map[string]string{"app": s.name}, Ports: []corev1.ServicePort{{Port: 80}}}}
		if _, err := f.Client.CoreV1().Services(lbNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range services {
		if s.cloud == "" {
			continue
		}
		want := nodesOf(t, ctx, s.nodes)
		var got *corev1.Service
		var lb fakelb.LoadBalancer
		// Targets seen at any time that are not the cloud's nodes: a
		// load balancer must never send traffic to another cloud's node.
		foreign := map[string]bool{}
		if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			var err error
			if got, err = f.Client.CoreV1().Services(lbNamespace).Get(ctx, s.name, metav1.GetOptions{}); err != nil {
				return false, nil
			}
			all := clouds.AllLoadBalancers()
			i := slices.IndexFunc(all, func(l fakelb.LoadBalancer) bool { return l.Service == lbNamespace+"/"+s.name })
			if i < 0 {
				return false, nil
			}
			lb = all[i]
			for _, n := range lb.Nodes {
				if !slices.Contains(want, n) {
					foreign[n] = true
				}
			}
			ing := got.Status.LoadBalancer.Ingress
			return len(ing) > 0 && ing[0].IP+ing[0].Hostname == lb.IP && slices.Equal(lb.Nodes, want), nil
		}); err != nil {
			t.Errorf("Service %s: address %v, load balancer %+v, want one of the %s cloud with targets %v; all load balancers %+v",
				s.name, got.Status.LoadBalancer.Ingress, lb, s.cloud, want, clouds.AllLoadBalancers())
			continue
		}
		if lb.Provider != s.cloud {
			t.Errorf("Service %s is served by the %s cloud, want %s", s.name, lb.Provider, s.cloud)
		}
		if len(foreign) > 0 {
			t.Errorf("Service %s: its load balancer targeted %v, not nodes %s", s.name, foreign, s.nodes)
		}
		if !slices.Contains(got.Finalizers, gate.LoadBalancerCleanupFinalizer) {
			t.Errorf("Service %s finalizers %v", s.name, got.Finalizers)
		}
		if s.class != nil && (got.Spec.LoadBalancerClass == nil || *got.Spec.LoadBalancerClass != *s.class) {
			t.Errorf("Service %s lost its class through the gate: %v", s.name, got.Spec.LoadBalancerClass)
		}
		t.Logf("Service %s: %s load balancer %s targeting %v", s.name, lb.Provider, lb.IP, lb.Nodes)
	}
	// Each served Service has exactly one load balancer, in its own cloud.
	if lbs := clouds.AllLoadBalancers(); len(lbs) != 3 {
		t.Errorf("load balancers %+v, want one per served Service", lbs)
	}
	if g, err := f.Client.CoreV1().Services(lbNamespace).Get(ctx, "web-gcp", metav1.GetOptions{}); err != nil || len(g.Status.LoadBalancer.Ingress) > 0 || len(g.Finalizers) > 0 {
		t.Errorf("Service web-gcp of a class nobody serves was changed: %+v %v", g.Status, err)
	}
	noForeignQuestions(t)

	// Deleting a Service removes its load balancer, then the finalizer: the
	// hcloud stand-in's, and the real AWS CCM's Classic ELB.
	for _, name := range []string{"web-hcloud", "web-aws"} {
		if err := f.Client.CoreV1().Services(lbNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"web-hcloud", "web-aws"} {
		if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := f.Client.CoreV1().Services(lbNamespace).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Errorf("Service %s not gone; load balancers %+v", name, clouds.AllLoadBalancers())
		}
	}
	if d := clouds.LoadBalancers.Deleted(); !slices.Equal(d, []string{"hcloud/" + lbNamespace + "/web-hcloud"}) {
		t.Errorf("test/fakelb's deleted load balancers %v, want hcloud's for web-hcloud", d)
	}
	var left []string
	for _, lb := range clouds.AllLoadBalancers() {
		left = append(left, lb.Provider+"/"+lb.Service)
	}
	if !slices.Equal(left, []string{"aws/" + lbNamespace + "/web-default"}) {
		t.Errorf("load balancers after the deletes: %v, want only aws's for web-default", left)
	}
}

// awsDomain selects the nodes of the first aws region's NativeCCM.
var awsDomain = fmt.Sprintf("%s=aws,%s=%s", names.PlatformLabel, corev1.LabelTopologyRegion, awsRegion)

// nodesOf are the names of the nodes a label selector selects, sorted.
func nodesOf(t *testing.T, ctx context.Context, selector string) []string {
	t.Helper()
	list, err := f.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range list.Items {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	if len(out) == 0 {
		t.Fatalf("no node %s", selector)
	}
	return out
}
