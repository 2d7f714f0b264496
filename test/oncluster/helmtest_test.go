package oncluster

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleethelm"
)

// The umbrella's test pods (charts/*/templates/tests), in the release
// namespace, and the coordinator's Deployment.
const (
	talosCCMTest    = "talos-ccm-test"
	coordinatorTest = "hybrid-ccm-test"
	coordinator     = "hybrid-ccm"
)

// helmTest runs `helm test hybrid-ccm -n kube-system --logs` on the
// working install: both test pods (hybridctl doctor, from the release's
// private registry, as their read-only ServiceAccounts, in the pod
// network) pass and say so. With the coordinator scaled to 0 the
// coordinator's test fails, its log naming the Deployment and the fix;
// scaled back, the next run replaces the pod and passes again. The test
// pods are deleted after (the other tests count the product's pods).
func helmTest(t *testing.T, ctx context.Context) {
	t.Cleanup(func() {
		for _, pod := range []string{talosCCMTest, coordinatorTest} {
			if err := f.Client.CoreV1().Pods(namespace).Delete(context.Background(), pod, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete test pod %s: %v", pod, err)
			}
		}
	})
	logs, err := fleethelm.Test(f, namespace, "hybrid-ccm", 5*time.Minute)
	t.Logf("helm test --logs:\n%s", logs)
	if err != nil {
		t.Fatalf("on a working install: %v", err)
	}
	for _, pod := range []string{talosCCMTest, coordinatorTest} {
		if !strings.Contains(logs, "POD LOGS: "+pod+"\n") {
			t.Errorf("no logs of test pod %s", pod)
		}
	}
	if strings.Count(logs, "No problems found.") != 2 || strings.Contains(logs, "note:") {
		t.Errorf("want two clean reports (no note: a right a test lacks), got:\n%s", logs)
	}

	// broken: the coordinator scaled to 0
	scale(t, ctx, ccmNamespace, coordinator, 0)
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := f.Client.AppsV1().Deployments(ccmNamespace).Get(ctx, coordinator, metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == 0 && d.Status.Replicas == 0, nil
	}); err != nil {
		t.Fatalf("coordinator not scaled down: %v", err)
	}
	logs, err = fleethelm.Test(f, namespace, "hybrid-ccm", 5*time.Minute, coordinatorTest)
	t.Logf("helm test --logs, coordinator scaled to 0:\n%s", logs)
	if err == nil {
		t.Errorf("helm test passes with the coordinator scaled to 0")
	}
	for _, s := range []string{"ControllerNotReady", "deployment/" + ccmNamespace + "/" + coordinator, "ccm-coordinator: scaled to 0 replicas",
		"kubectl -n " + ccmNamespace + " scale deploy/" + coordinator + " --replicas=1"} {
		if !strings.Contains(logs, s) {
			t.Errorf("the failed test's log lacks %q", s)
		}
	}

	// restored: the coordinator leads again, its NativeCCMs stay Ready
	scale(t, ctx, ccmNamespace, coordinator, 1)
	fleetcheck.WaitRolledOut(t, ctx, f, ccmNamespace, coordinator, version)
	waitCoordinatorLeads(t, ctx)
	for _, name := range nativeCCMs {
		chartstest.WaitNativeCCMRunning(t, ctx, f.Config, name)
	}
	logs, err = fleethelm.Test(f, namespace, "hybrid-ccm", 5*time.Minute)
	if err != nil || strings.Count(logs, "No problems found.") != 2 {
		t.Errorf("helm test after the coordinator is back: %v\n%s", err, logs)
	}
}

// scale sets a Deployment's replicas (kubectl scale).
func scale(t *testing.T, ctx context.Context, ns, name string, replicas int32) {
	t.Helper()
	s, err := f.Client.AppsV1().Deployments(ns).GetScale(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Replicas = replicas
	if _, err := f.Client.AppsV1().Deployments(ns).UpdateScale(ctx, name, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitCoordinatorLeads waits until a running coordinator pod holds the
// coordinator's Lease.
func waitCoordinatorLeads(t *testing.T, ctx context.Context) {
	t.Helper()
	var holder string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := f.Client.CoordinationV1().Leases(ccmNamespace).Get(ctx, names.CoordinatorLease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return false, nil
		}
		holder = *l.Spec.HolderIdentity
		pods, err := f.Client.CoreV1().Pods(ccmNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=ccm-coordinator"})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && strings.HasPrefix(holder, p.Name) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no running coordinator pod holds lease %s (holder %q): %v", names.CoordinatorLease, holder, err)
	}
}
