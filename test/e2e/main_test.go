// Package e2e runs the real talos-ccm binary against a real kube-apiserver with
// simulated Talos nodes speaking the real Talos API.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var (
	env      *testenv.Env
	binaries string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hybrid-ccm-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The run's builds (test/testbin), or built into dir.
	if binaries, err = testbin.DevDirectory(dir, "talos-ccm", "ccm-coordinator"); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n", err)
		os.Exit(1)
	}
	code := testenv.Run(m, testenv.Options{
		CRDDirectoryPaths: []string{filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator", "crds")},
	}, func(e *testenv.Env) { env = e })
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// process is a running talos-ccm.
type process struct {
	cmd  *exec.Cmd
	logs *testenv.Buffer
	done chan struct{}
	err  error
}

// talosCCMArgs are the flags every test run uses: the test's API server and
// talosconfig, no serving port (tests run one after another), no leader election.
func talosCCMArgs(t *testing.T, ep *talosnode.Endpoint, extra ...string) []string {
	t.Helper()
	tc := filepath.Join(t.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(tc, "os:reader"); err != nil {
		t.Fatal(err)
	}
	return append([]string{
		"--kubeconfig=" + env.KubeconfigPath,
		"--authentication-kubeconfig=" + env.KubeconfigPath,
		"--authorization-kubeconfig=" + env.KubeconfigPath,
		"--talosconfig=" + tc,
		"--leader-elect=false",
		"--secure-port=0",
		"--node-status-update-frequency=1h",
		"--v=2",
	}, extra...)
}

// startTalosCCM runs the binary until the test ends.
func startTalosCCM(t *testing.T, args []string) *process {
	t.Helper()
	p := &process{logs: &testenv.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(binaries, "talos-ccm"), args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("talos-ccm logs:\n%s", tail(p.logs.String(), 6000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// kubeletNode is a Node as a kubelet with --cloud-provider=external registers it.
func kubeletNode(name string, providedIPs ...string) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{corev1.LabelHostname: name, corev1.LabelOSStable: "linux"},
			Annotations: map[string]string{},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{
			Key: cloudproviderapi.TaintExternalCloudProvider, Value: "true", Effect: corev1.TaintEffectNoSchedule,
		}}},
	}
	if len(providedIPs) > 0 {
		n.Annotations[cloudproviderapi.AnnotationAlphaProvidedIPAddr] = strings.Join(providedIPs, ",")
	}
	return n
}

// register creates the node and sets the status the kubelet reports before
// the cloud provider has initialized it.
func register(t *testing.T, n *corev1.Node, statusIPs ...string) {
	t.Helper()
	ctx := context.Background()
	created, err := env.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("register node %s: %v", n.Name, err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: n.Name}}
	for _, ip := range statusIPs {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}
	if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node %s status: %v", n.Name, err)
	}
}

func initialized(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == cloudproviderapi.TaintExternalCloudProvider {
			return false
		}
	}
	return true
}

// waitNode polls until cond holds for the node (or fails after timeout).
func waitNode(t *testing.T, name string, timeout time.Duration, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	var last *corev1.Node
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return cond(n), nil
	})
	if err != nil {
		t.Fatalf("node %s: condition not reached within %s; last seen: labels=%v taints=%v providerID=%q addresses=%v",
			name, timeout, labelsOf(last), taintsOf(last), providerIDOf(last), addressesOf(last))
	}
	return last
}

func labelsOf(n *corev1.Node) map[string]string {
	if n == nil {
		return nil
	}
	return n.Labels
}

func taintsOf(n *corev1.Node) []corev1.Taint {
	if n == nil {
		return nil
	}
	return n.Spec.Taints
}

func providerIDOf(n *corev1.Node) string {
	if n == nil {
		return ""
	}
	return n.Spec.ProviderID
}

func addressesOf(n *corev1.Node) []corev1.NodeAddress {
	if n == nil {
		return nil
	}
	return n.Status.Addresses
}

// eventsFor lists events whose involved object is the node.
func eventsFor(t *testing.T, node, reason string) []corev1.Event {
	t.Helper()
	list, err := env.Client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=" + reason,
	})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func waitEvent(t *testing.T, node, reason string, timeout time.Duration) corev1.Event {
	t.Helper()
	var ev []corev1.Event
	_ = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ev = eventsFor(t, node, reason)
		return len(ev) > 0, nil
	})
	if len(ev) == 0 {
		t.Fatalf("no %s event for node %s within %s", reason, node, timeout)
	}
	return ev[0]
}
