package fleetcheck

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/registry"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// WaitClusterDNS waits until the Service kube-dns has a ready endpoint for
// every replica of the CoreDNS Deployment, and returns their addresses.
func WaitClusterDNS(t *testing.T, ctx context.Context, f *fleet.Fleet) []string {
	t.Helper()
	var ready []string
	var lastErr error
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := f.Client.AppsV1().Deployments(fleet.DNSNamespace).Get(ctx, fleet.CoreDNS, metav1.GetOptions{})
		if err != nil {
			lastErr = err
			return false, nil
		}
		if ready, lastErr = f.ClusterDNSEndpoints(ctx); lastErr != nil {
			return false, nil
		}
		return d.Spec.Replicas != nil && len(ready) == int(*d.Spec.Replicas), nil
	}); err != nil {
		pods, _ := f.Client.CoreV1().Pods(fleet.DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: fleet.DNSPodSelector})
		var states []string
		for _, p := range pods.Items {
			states = append(states, fmt.Sprintf("%s on %q: %s %v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions))
		}
		t.Fatalf("cluster DNS not ready: ready endpoints %v (%v); CoreDNS pods %v", ready, lastErr, states)
	}
	return ready
}

// TalosAPI is where a name of the Talos Service must lead: the Service's
// ClusterIP, and the addresses of the control planes among machines, whose
// apids serve it.
func TalosAPI(t *testing.T, ctx context.Context, f *fleet.Fleet, machines []fleet.Machine) (clusterIP string, controlPlanes []string) {
	t.Helper()
	svc, err := f.Client.CoreV1().Services(talos.ServiceNamespace).Get(ctx, talos.ServiceName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		if m.ControlPlane {
			controlPlanes = append(controlPlanes, f.Node(m.Name).IP.String())
		}
	}
	return svc.Spec.ClusterIP, controlPlanes
}

// ControlPlaneForwards is how many requests the apids of the control planes
// among machines forwarded to other machines.
func ControlPlaneForwards(f *fleet.Fleet, machines []fleet.Machine) int64 {
	var n int64
	for _, m := range machines {
		if m.ControlPlane {
			n += f.Talos.Forwarded(m.Name)
		}
	}
	return n
}

// ProbeImage is where StartProbe pushes test/cluster/probe.
func ProbeImage(f *fleet.Fleet) string { return f.Registry.Host() + "/test/probe:v1" }

// StartProbe runs test/cluster/probe (its image pushed to the fleet's
// registry) as the pod name on node, with the cluster's defaults for DNS
// (dnsPolicy ClusterFirst: cluster DNS through the kubelet's clusterDNS),
// tolerating every taint, and waits until it is ready. Commands run in it
// with Probe.
func StartProbe(t *testing.T, ctx context.Context, f *fleet.Fleet, name, node string) *corev1.Pod {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "probe")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./test/cluster/probe")
	build.Dir = testenv.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build test/cluster/probe: %v\n%s", err, out)
	}
	if _, err := f.Registry.PushBinary(ctx, ProbeImage(f), bin, registry.ImageOptions{Path: "/probe"}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: ptr.To(false),
			Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			SecurityContext:              &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: "probe", Image: ProbeImage(f), Args: []string{"serve"},
				SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
			}},
		},
	}
	if _, err := f.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.Client.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	var got *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := f.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = p
		return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}), nil
	}); err != nil {
		t.Fatalf("probe pod %s on %s not ready: %+v", name, node, got.Status)
	}
	return got
}

// Probe runs `probe args...` in a pod StartProbe started (through the API
// server and the node's kubelet: its serving certificate must be issued)
// and returns the lines it printed, or its error output as the error.
func Probe(ctx context.Context, f *fleet.Fleet, pod *corev1.Pod, args ...string) ([]string, error) {
	out, errOut, err := f.Exec(ctx, pod.Namespace, pod.Name, "probe", append([]string{"/probe"}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("probe %s in %s: %w: %s", strings.Join(args, " "), pod.Name, err, strings.TrimSpace(errOut))
	}
	return strings.Fields(out), nil
}
