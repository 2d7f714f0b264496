package doccommands

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

// docs/migrating-from-a-cloud-ccm.md: the AWS CCM as its own chart installs
// it, Hybrid CCM beside it, the AWS CCM uninstalled. The world runs no
// controllers: what the AWS CCM and the coordinator would write (the AWS CCM's
// Lease, the NativeCCM's status, the native CCM's Lease) is written by the
// steps before the commands that show it; test/takeover runs the same path on
// a real cluster, with the real AWS CCM and coordinator.

const (
	// previousRelease is the AWS CCM's release, as its chart's own docs
	// install it (and its DaemonSet's name, the chart's nameOverride).
	previousRelease = "aws-cloud-controller-manager"
	// previousHolder is how the AWS CCM's leader election names its pod.
	previousHolder = "aws-cloud-controller-manager-x7k2p_5c1e0f3a-8d2b-4f6e-9a7c-1b3d5e7f9a0c"
)

// awsCCMChart is the AWS CCM's own chart, charts/aws-cloud-controller-manager
// of k8s.io/cloud-provider-aws at the release hack/aws-ccm.sh builds, from the
// Go module cache (where hack/aws-ccm.sh keeps the module).
func awsCCMChart(t *testing.T, w *world) string {
	t.Helper()
	bin := strings.TrimSpace(w.sh(t, w.repo, "hack/aws-ccm.sh 2>/dev/null"))
	tag, ok := strings.CutPrefix(filepath.Base(filepath.Dir(bin)), "aws-ccm-")
	if !ok {
		t.Fatalf("hack/aws-ccm.sh printed %q, not a binary in aws-ccm-<tag>", bin)
	}
	cmd := exec.Command("go", "mod", "download", "-json", "k8s.io/cloud-provider-aws@"+tag)
	cmd.Dir = t.TempDir() // outside any module
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, err := cmd.Output()
	var dl struct{ Dir string }
	if jerr := json.Unmarshal(out, &dl); err != nil || jerr != nil || dl.Dir == "" {
		t.Fatalf("go mod download k8s.io/cloud-provider-aws@%s: %v %v\n%s", tag, err, jerr, out)
	}
	return filepath.Join(dl.Dir, "charts", "aws-cloud-controller-manager")
}

// previousAWSCCM installs the AWS CCM's own chart as the cluster had it
// (release aws-cloud-controller-manager in kube-system, the chart's values),
// and its Lease as its leader election keeps it: held by its pod, renewed now.
func previousAWSCCM(t *testing.T, w *world) {
	t.Helper()
	w.sh(t, w.work, "helm install "+previousRelease+" "+awsCCMChart(t, w)+" -n kube-system")
	now := metav1.NowMicro()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "cloud-controller-manager", Namespace: "kube-system"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(previousHolder), LeaseDurationSeconds: ptr.To(int32(15)),
			AcquireTime: &now, RenewTime: &now}}
	if _, err := w.kube.CoordinationV1().Leases("kube-system").Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func previousAWSCCMListed(t *testing.T, _ *world, line, out string) {
	r := row(out, previousRelease)
	if len(r) < 2 || r[1] != "kube-system" || !strings.Contains(out, "aws-cloud-controller-manager-") {
		t.Errorf("%s: no release %s in kube-system of chart aws-cloud-controller-manager:\n%s", line, previousRelease, out)
	}
}

func previousLeaseShown(t *testing.T, _ *world, line, out string) {
	for _, want := range []string{"holderIdentity: " + previousHolder, "renewTime:", "leaseDurationSeconds: 15"} {
		if !strings.Contains(out, want) {
			t.Errorf("%s: no %q in\n%s", line, want, out)
		}
	}
}

// takeOverInstalled: the doc's values give the NativeCCM aws that serves the
// Services without a class and takes over from the Lease, the Role that lets
// the coordinator read that Lease, and talos-ccm in enforce mode.
func takeOverInstalled(t *testing.T, w *world, _, _ string) {
	wantRelease(t, w, "hybrid-ccm", "kube-system", 1)
	a := w.nativeCCM(t, "aws")
	if a == nil {
		t.Fatal("no NativeCCM aws")
	}
	for path, want := range map[string]string{
		"spec.takeOver.lease":             "kube-system/cloud-controller-manager",
		"spec.loadBalancers.enabled":      "true",
		"spec.loadBalancers.default":      "true",
		"spec.credentials.secretRef.name": "aws-ccm",
	} {
		if got := field(t, a, strings.Split(path, ".")...); got != want {
			t.Errorf("NativeCCM aws: %s = %q, want %q (takeover.yaml)", path, got, want)
		}
	}
	role, err := w.kube.RbacV1().Roles("kube-system").Get(ctx, "hybrid-ccm:take-over:aws", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"cloud-controller-manager"}, Verbs: []string{"get"}}}
	if !equality.Semantic.DeepEqual(role.Rules, want) {
		t.Errorf("Role kube-system/%s: rules %+v, want %+v", role.Name, role.Rules, want)
	}
	cms, err := w.kube.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=hybrid-ccm"})
	if err != nil {
		t.Fatal(err)
	}
	enforce := false
	for _, cm := range cms.Items {
		for _, v := range cm.Data {
			enforce = enforce || strings.Contains(v, "enforce: true")
		}
	}
	if !enforce {
		t.Errorf("no talos-ccm ConfigMap of the release says enforce: true (takeover.yaml)")
	}
}

// setNativeCCMStatus writes the Ready condition the coordinator writes, with
// the release it records when it says so.
func setNativeCCMStatus(t *testing.T, w *world, ready metav1.ConditionStatus, reason, message string, installed bool) {
	t.Helper()
	n := w.nativeCCM(t, "aws")
	if n == nil {
		t.Fatal("no NativeCCM aws")
	}
	cond := map[string]any{"type": "Ready", "status": string(ready), "reason": reason, "message": message,
		"lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z"), "observedGeneration": n.GetGeneration()}
	status := map[string]any{"conditions": []any{cond}, "nodes": int64(2), "observedGeneration": n.GetGeneration()}
	if installed {
		status["release"] = map[string]any{"name": "native-ccm-aws", "namespace": "hybrid-ccm-system", "revision": int64(1), "status": "deployed"}
		status["leader"] = map[string]any{"lease": "hybrid-ccm-system/native-ccm-aws", "holder": "native-ccm-aws-6d4b7c9f8-kx7vq_8e1f5a0c"}
	}
	if err := unstructured.SetNestedField(n.Object, status, "status"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.dyn.Resource(nativeCCMs).UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

const waitingMessage = `waiting for the previous CCM to stop: Lease kube-system/cloud-controller-manager is held by "` + previousHolder +
	`", renewed 1s ago (lease duration 15s) (spec.takeOver.lease), so it still runs and would initialize and delete nodes and serve Services beside this one; ` +
	`uninstall it (docs/migrating-from-a-cloud-ccm.md): its Lease runs out 15s after its last renewal, then native-ccm-aws is installed`

// nativeCCMWaitingStatus is what the coordinator writes while the AWS CCM leads.
func nativeCCMWaitingStatus(t *testing.T, w *world) {
	setNativeCCMStatus(t, w, metav1.ConditionFalse, "WaitingForPreviousCCM", waitingMessage, false)
}

func nativeCCMWaitingShown(t *testing.T, _ *world, line, out string) {
	r := row(out, "aws")
	if len(r) < 3 || r[1] != "aws" || !strings.Contains(out, "False") || !strings.Contains(out, "waiting for the previous CCM to stop") {
		t.Errorf("%s: no row for aws, READY False, waiting for the previous CCM:\n%s", line, out)
	}
}

func nativeCCMWaitingDescribed(t *testing.T, _ *world, line, out string) {
	for _, want := range []string{"Name:", "aws", "Take Over:", "kube-system/cloud-controller-manager", "WaitingForPreviousCCM", previousHolder} {
		if !strings.Contains(out, want) {
			t.Errorf("%s: no %q in\n%s", line, want, out)
		}
	}
}

func previousAWSCCMGone(t *testing.T, w *world, _, _ string) {
	if r := w.release(t, previousRelease, "kube-system"); r != nil {
		t.Errorf("release %s is still there: %s", previousRelease, r.Status)
	}
	if _, err := w.kube.AppsV1().DaemonSets("kube-system").Get(ctx, previousRelease, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("DaemonSet kube-system/%s: %v, want gone", previousRelease, err)
	}
	if _, err := w.kube.RbacV1().ClusterRoles().Get(ctx, "system:cloud-controller-manager", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole system:cloud-controller-manager: %v, want gone with the release", err)
	}
	// The Lease stays, as the doc says.
	if _, err := w.kube.CoordinationV1().Leases("kube-system").Get(ctx, "cloud-controller-manager", metav1.GetOptions{}); err != nil {
		t.Errorf("Lease kube-system/cloud-controller-manager: %v, want it left", err)
	}
}

// previousPodsLabel: the doc waits for the AWS CCM's pods by the label its
// chart puts on them; it must select the DaemonSet's pods (checked before
// the uninstall, on the chart as installed).
func previousPodsLabel(t *testing.T, w *world) {
	t.Helper()
	// the release is gone by now: render its chart's DaemonSet again
	out := w.sh(t, w.work, "helm template "+previousRelease+" "+awsCCMChart(t, w)+" -n kube-system -s templates/daemonset.yaml")
	if !strings.Contains(out, "k8s-app:  aws-cloud-controller-manager") && !strings.Contains(out, "k8s-app: aws-cloud-controller-manager") {
		t.Fatalf("the AWS CCM's chart labels its pods otherwise than k8s-app=aws-cloud-controller-manager:\n%s", out)
	}
}

func noPreviousPods(t *testing.T, w *world, line, out string) {
	pods, err := w.kube.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=" + previousRelease})
	if err != nil || len(pods.Items) > 0 {
		t.Errorf("%s: pods %v, %v; want none", line, pods, err)
	}
}

// nativeCCMReadyStatus is what the coordinator writes once the native CCM
// leads, and its Lease as the native CCM keeps it.
func nativeCCMReadyStatus(t *testing.T, w *world) {
	t.Helper()
	setNativeCCMStatus(t, w, metav1.ConditionTrue, "InstallSucceeded", "installed release native-ccm-aws revision 1", true)
	now := metav1.NowMicro()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-aws", Namespace: "hybrid-ccm-system"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("native-ccm-aws-6d4b7c9f8-kx7vq_8e1f5a0c"), LeaseDurationSeconds: ptr.To(int32(100)),
			AcquireTime: &now, RenewTime: &now}}
	if _, err := w.kube.CoordinationV1().Leases("hybrid-ccm-system").Create(ctx, lease, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func nativeCCMReadyWaited(t *testing.T, _ *world, line, out string) {
	if !strings.Contains(out, "nativeccm.hybridccm.io/aws condition met") {
		t.Errorf("%s: %s", line, out)
	}
}

func nativeLeaseShown(t *testing.T, _ *world, line, out string) {
	if r := row(out, "native-ccm-aws"); len(r) < 2 || !strings.HasPrefix(r[1], "native-ccm-aws-") {
		t.Errorf("%s: no Lease native-ccm-aws held by a pod of the release:\n%s", line, out)
	}
}

// servicesListed, then Hybrid CCM goes again for the lines that follow (no
// coordinator put a finalizer on the NativeCCM here).
func servicesListed(t *testing.T, w *world, line, out string) {
	if h := row(out, "NAMESPACE"); len(h) < 5 || h[2] != "TYPE" || h[4] != "EXTERNAL-IP" {
		t.Errorf("%s: columns %v, want NAMESPACE NAME TYPE CLUSTER-IP EXTERNAL-IP ...", line, h)
	}
	w.sh(t, w.work, "helm uninstall hybrid-ccm -n kube-system --wait")
	if err := w.kube.CoordinationV1().Leases("kube-system").Delete(ctx, "cloud-controller-manager", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.kube.CoordinationV1().Leases("hybrid-ccm-system").Delete(ctx, "native-ccm-aws", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
