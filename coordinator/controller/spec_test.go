package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// quiet is how long a test watches for something that must not happen (an
// install, upgrade or uninstall) after the reconciler has seen the change that
// would cause it: several grace periods and retry intervals of this suite.
const quiet = 3 * time.Second

// never fails the test if cond becomes true within d.
func never(t *testing.T, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if bad, state := cond(); bad {
			t.Fatalf("%s happened: %s", what, state)
		}
	}
}

// waitObserved waits until the reconciler has handled the NativeCCM's current
// generation (a suspended NativeCCM is handled by doing nothing).
func waitObserved(t *testing.T, name string) *v1.NativeCCM {
	t.Helper()
	var obj *v1.NativeCCM
	eventually(t, name+" generation observed", func() (bool, string) {
		obj = getNativeCCM(t, name)
		return obj.Status.ObservedGeneration == obj.Generation && slices.Contains(obj.Finalizers, v1.Finalizer),
			fmt.Sprintf("generation %d, observed %d, finalizers %v", obj.Generation, obj.Status.ObservedGeneration, obj.Finalizers)
	})
	return obj
}

// history returns the revisions of a release in Helm's storage.
func history(t *testing.T, release string) int {
	t.Helper()
	var secrets corev1.SecretList
	if err := k8s.List(ctxT(t), &secrets, client.InNamespace(releaseNamespace), client.MatchingLabels{"owner": "helm", "name": release}); err != nil {
		t.Fatal(err)
	}
	return len(secrets.Items)
}

// requestReconcile asks for a reconcile the Flux way (how a profile or lease
// change reaches a NativeCCM before the next --interval).
func requestReconcile(t *testing.T, name string) {
	t.Helper()
	updateNativeCCM(t, name, func(o *v1.NativeCCM) {
		if o.Annotations == nil {
			o.Annotations = map[string]string{}
		}
		o.Annotations[meta.ReconcileRequestAnnotation] = time.Now().Format(time.RFC3339Nano)
	})
}

// TestGateStatusAndDelete: a gated NativeCCM carries the fence's parameters
// in status.gate (its ServiceAccount, the profile's providerID prefixes) and
// the Gated condition names the policy; deleting it removes its release, and
// the fence itself, which all native CCMs share and the chart owns, stays.
func TestGateStatusAndDelete(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "fa-1", "fence-a", "hcloud://9001")
	obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "fence-a"}, Spec: v1.NativeCCMSpec{Platform: "fence-a"}}
	createNativeCCM(t, obj)
	got := waitCondition(t, "fence-a", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if !conditions.IsTrue(got, v1.GatedCondition) || !strings.Contains(conditions.GetMessage(got, v1.GatedCondition), gate.DefaultFenceName) {
		t.Fatalf("not gated: %+v", got.Status.Conditions)
	}
	want := &v1.GateStatus{Policy: gate.DefaultFenceName, ServiceAccount: releaseNamespace + "/native-ccm-fence-a", ProviderIDPrefixes: []string{"hcloud://", "hrobot://"}}
	if !reflect.DeepEqual(got.Status.Gate, want) {
		t.Fatalf("status.gate %+v, want %+v", got.Status.Gate, want)
	}

	if err := k8s.Delete(ctxT(t), obj); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NativeCCM and release gone", func() (bool, string) {
		err := k8s.Get(ctxT(t), client.ObjectKey{Name: "fence-a"}, &v1.NativeCCM{})
		_, derr := getDeployment(t, "native-ccm-fence-a")
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(derr), fmt.Sprintf("nativeccm: %v, deployment: %v", err, derr)
	})
	if err := gate.CheckFence(ctxT(t), k8s, gate.Fence{Namespace: releaseNamespace}); err != nil {
		t.Fatalf("the shared fence did not survive a NativeCCM: %v", err)
	}
}

// TestInstallAlways: install: Always installs without a single node of the
// platform; back to Auto, the release goes (no nodes, grace period over).
func TestInstallAlways(t *testing.T) {
	hcloudSecret(t)
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "always-a"},
		Spec:       v1.NativeCCMSpec{Platform: "always-a", Install: v1.InstallAlways},
	})
	obj := waitCondition(t, "always-a", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if obj.Status.Nodes != 0 || obj.Status.Release == nil || obj.Status.Release.Revision != 1 {
		t.Fatalf("status = %+v", obj.Status)
	}
	if _, err := getDeployment(t, "native-ccm-always-a"); err != nil {
		t.Fatalf("no release Deployment without nodes: %v", err)
	}
	// Still there on the next looks (the grace period of Auto does not apply).
	requestReconcile(t, "always-a")
	never(t, "uninstall of an Always release", quiet, func() (bool, string) {
		_, err := getDeployment(t, "native-ccm-always-a")
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})

	updateNativeCCM(t, "always-a", func(o *v1.NativeCCM) { o.Spec.Install = v1.InstallAuto })
	waitCondition(t, "always-a", v1.InstalledCondition, metav1.ConditionFalse, v1.NoNodesReason)
	eventually(t, "deployment removed", func() (bool, string) {
		_, err := getDeployment(t, "native-ccm-always-a")
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// TestSuspend: a suspended NativeCCM is neither installed, upgraded nor
// uninstalled; each resumes as soon as suspend is false again.
func TestSuspend(t *testing.T) {
	const name, rel = "suspend-a", "native-ccm-suspend-a"
	hcloudSecret(t)
	createNode(t, "sa-1", name, "hcloud://9101")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.NativeCCMSpec{Platform: name, Suspend: true,
			UninstallGracePeriod: &metav1.Duration{Duration: time.Second}},
	})
	released := func() (bool, string) {
		_, err := getDeployment(t, rel)
		n := history(t, rel)
		return err == nil || n > 0, fmt.Sprintf("deployment: %v, revisions: %d", err, n)
	}

	// Suspended from the start, with a node and credentials: no install.
	waitObserved(t, name)
	never(t, "install while suspended", quiet, released)
	if obj := getNativeCCM(t, name); obj.Status.Release != nil {
		t.Fatalf("release recorded while suspended: %+v", obj.Status.Release)
	}
	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Suspend = false })
	obj := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if obj.Status.Release.Revision != 1 {
		t.Fatalf("release = %+v", obj.Status.Release)
	}

	// A change that needs an upgrade, made while suspended: no upgrade.
	updateNativeCCM(t, name, func(o *v1.NativeCCM) {
		o.Spec.Suspend = true
		o.Spec.Overrides = &v1.Overrides{Args: []string{"--v=4"}}
	})
	waitObserved(t, name)
	never(t, "upgrade while suspended", quiet, func() (bool, string) {
		n := history(t, rel)
		return n != 1, fmt.Sprintf("revisions: %d", n)
	})
	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Suspend = false })
	obj = waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.UpgradeSucceededReason)
	if obj.Status.Release.Revision != 2 {
		t.Fatalf("release = %+v", obj.Status.Release)
	}
	if d, err := getDeployment(t, rel); err != nil || !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--v=4") {
		t.Fatalf("upgrade after resume not applied: %v", err)
	}

	// The last node goes while suspended: no uninstall, grace period or not.
	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Suspend = true })
	waitObserved(t, name)
	deleteNode(t, "sa-1")
	never(t, "uninstall while suspended", quiet, func() (bool, string) {
		_, err := getDeployment(t, rel)
		return err != nil, fmt.Sprint(err)
	})
	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Suspend = false })
	waitCondition(t, name, v1.InstalledCondition, metav1.ConditionFalse, v1.NoNodesReason)
	eventually(t, "release removed after resume", func() (bool, string) {
		bad, state := released()
		return !bad, state
	})
}

// TestProfileChangeUpgrades: a changed profile (not the NativeCCM) makes a new
// revision once the NativeCCM is reconciled.
func TestProfileChangeUpgrades(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "pa-1", "profile-a", "hcloud://9201")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "profile-a"},
		Spec:       v1.NativeCCMSpec{Platform: "profile-a"},
	})
	obj := waitCondition(t, "profile-a", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	first := *obj.Status.Release

	if err := profiles.edit("profile-a", func(p *profile.Profile) {
		p.CCM.Image.Tag = "v9.8.7"
		p.CCM.Args = append(p.CCM.Args, "--profile-changed=true")
	}); err != nil {
		t.Fatal(err)
	}
	requestReconcile(t, "profile-a")
	obj = waitCondition(t, "profile-a", meta.ReadyCondition, metav1.ConditionTrue, v1.UpgradeSucceededReason)
	if obj.Status.Release.Revision != 2 || obj.Status.Release.Digest == first.Digest {
		t.Errorf("release = %+v, first %+v", obj.Status.Release, first)
	}
	d, err := getDeployment(t, "native-ccm-profile-a")
	if err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if !strings.HasSuffix(c.Image, ":v9.8.7") || !slices.Contains(c.Args, "--profile-changed=true") {
		t.Errorf("profile change not in the release: image %s, args %v", c.Image, c.Args)
	}
}

// TestForeignLeaseHolderIsConflict: the release's lease held by someone who is
// not one of its pods is a LeaseNameShared conflict (reported, not blocking);
// held by the release's pod, it is none.
func TestForeignLeaseHolderIsConflict(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "la-1", "lease-a", "hcloud://9301")
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "native-ccm-lease-a", Namespace: releaseNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someones-ccm-5d8f9_1f2e3d4c")},
	}
	create(t, lease)
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "lease-a"},
		Spec:       v1.NativeCCMSpec{Platform: "lease-a"},
	})
	obj := waitCondition(t, "lease-a", v1.ConflictCondition, metav1.ConditionTrue, v1.LeaseNameSharedReason)
	want := `lease ` + releaseNamespace + `/native-ccm-lease-a is held by "someones-ccm-5d8f9_1f2e3d4c", which is not this release's pod`
	if msg := conditions.GetMessage(obj, v1.ConflictCondition); msg != want {
		t.Errorf("conflict message %q, want %q", msg, want)
	}
	if ok, state := hasEvent(t, "lease-a", v1.LeaseNameSharedReason); !ok {
		t.Errorf("no LeaseNameShared event: %s", state)
	}
	// Reported, never blocking.
	waitCondition(t, "lease-a", v1.InstalledCondition, metav1.ConditionTrue, "")

	// Our pod takes the lease: no conflict.
	if err := k8s.Get(ctxT(t), client.ObjectKeyFromObject(lease), lease); err != nil {
		t.Fatal(err)
	}
	lease.Spec.HolderIdentity = ptr.To("native-ccm-lease-a-7c9d8f6b5-x2x4z_0a1b2c3d")
	if err := k8s.Update(ctxT(t), lease); err != nil {
		t.Fatal(err)
	}
	requestReconcile(t, "lease-a")
	waitCondition(t, "lease-a", v1.ConflictCondition, metav1.ConditionFalse, v1.NoConflictReason)
}

// TestGatedUpstreamChart: an upstream chart from the HTTP chart repository that
// sets its own --kubeconfig and --master is installed with the gate: the
// ccm-gate sidecar, the CCM pointed at it on loopback, and an active fence for
// this NativeCCM's ServiceAccount.
func TestGatedUpstreamChart(t *testing.T) {
	const name, rel = "upstream-b", "native-ccm-upstream-b"
	hcloudSecret(t)
	createNode(t, "upb-1", name, "hcloud://9401")
	createNode(t, "upb-aws-1", "aws", "aws:///eu-central-1a/i-9401")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NativeCCMSpec{Platform: name},
	})
	obj := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if obj.Status.Release.Chart != "fake-ccm@1.0.0" {
		t.Errorf("chart = %s", obj.Status.Release.Chart)
	}
	if c := conditions.Get(obj, v1.GatedCondition); c == nil || c.Status != metav1.ConditionTrue || c.Reason != gate.GateEnforcedReason {
		t.Errorf("Gated = %+v", c)
	}

	d, err := getDeployment(t, rel+"-upstream")
	if err != nil {
		t.Fatal(err)
	}
	spec := d.Spec.Template.Spec
	// the view: ccm-gate as a native sidecar, for this platform, on loopback
	var sidecar *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == gate.SidecarName {
			sidecar = &spec.InitContainers[i]
		}
	}
	if sidecar == nil {
		t.Fatalf("no %s init container: %+v", gate.SidecarName, spec.InitContainers)
	}
	if sidecar.RestartPolicy == nil || *sidecar.RestartPolicy != corev1.ContainerRestartPolicyAlways || sidecar.Image != gateImage {
		t.Errorf("sidecar restartPolicy %v image %s", sidecar.RestartPolicy, sidecar.Image)
	}
	for _, want := range []string{"--platform=" + name, "--listen=127.0.0.1:20314", "--credentials=own", "--client-token-file=" + gate.ClientTokenPath} {
		if !slices.Contains(sidecar.Args, want) {
			t.Errorf("sidecar args %v lack %s", sidecar.Args, want)
		}
	}
	// the CCM talks to the gate only: the chart's --kubeconfig and --master are gone
	ccm := spec.Containers[0]
	all := append(append([]string{}, ccm.Command...), ccm.Args...)
	var kubeconfigs []string
	for _, a := range all {
		if strings.Contains(a, "kubeconfig") || strings.HasPrefix(a, "--master") {
			kubeconfigs = append(kubeconfigs, a)
		}
	}
	if want := []string{"--kubeconfig=" + gate.KubeconfigPath, "--authentication-kubeconfig=" + gate.KubeconfigPath, "--authorization-kubeconfig=" + gate.KubeconfigPath}; !slices.Equal(kubeconfigs, want) {
		t.Errorf("CCM API server flags %v, want only %v", kubeconfigs, want)
	}
	if a := d.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v: only the gate may hold the token", a)
	}
	if !slices.Contains(ccm.Args, "--controllers=cloud-node-lifecycle") {
		t.Errorf("CCM args %v", ccm.Args)
	}
	if !slices.ContainsFunc(ccm.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/etc/ccm-gate" }) {
		t.Errorf("kubeconfig not mounted: %+v", ccm.VolumeMounts)
	}
	if d.Spec.Template.Annotations[gate.KubeconfigAnnotation] == "" {
		t.Errorf("pod annotations %v lack %s", d.Spec.Template.Annotations, gate.KubeconfigAnnotation)
	}
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(ctxT(t), client.ObjectKey{Namespace: releaseNamespace, Name: rel + "-gate"}, cm); err != nil {
		t.Fatalf("gate kubeconfig: %v", err)
	}
	if kc := cm.Data["kubeconfig"]; !strings.Contains(kc, "https://127.0.0.1:20314") || !strings.Contains(kc, gate.ClientTokenPath) {
		t.Errorf("kubeconfig does not point at the gate with the gate's client token:\n%s", kc)
	}

	// the fence: its parameters for this NativeCCM, enforced for the
	// release's ServiceAccount
	user := gatetest.Username(releaseNamespace, rel)
	var gated v1.NativeCCM
	if err := k8s.Get(ctxT(t), client.ObjectKey{Name: name}, &gated); err != nil {
		t.Fatal(err)
	}
	if g := gated.Status.Gate; g == nil || g.ServiceAccount != releaseNamespace+"/"+rel || len(g.ProviderIDPrefixes) == 0 {
		t.Fatalf("status.gate %+v, want ServiceAccount %s/%s and the profile's prefixes", g, releaseNamespace, rel)
	}
	cfg, err := gatetest.ServiceAccountUser(env, releaseNamespace, rel)
	if err != nil {
		t.Fatal(err)
	}
	ccmClient := kubernetes.NewForConfigOrDie(cfg)
	// The release's own RBAC lets it patch nodes: the fence is what refuses.
	if err := gatetest.WaitFence(ctxT(t), ccmClient, "upb-aws-1", true); err != nil {
		t.Fatalf("fence not enforced for %s: %v", user, err)
	}
	// On its own node it may add the shutdown taint (every other taint kept,
	// as cloud-provider's helper sends it), and nothing else.
	own, err := env.Client.CoreV1().Nodes().Get(ctxT(t), "upb-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	taints, _ := json.Marshal(append(own.Spec.Taints, corev1.Taint{Key: gate.ShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule}))
	_, err = ccmClient.CoreV1().Nodes().Patch(ctxT(t), "upb-1", types.StrategicMergePatchType,
		[]byte(`{"spec":{"taints":`+string(taints)+`}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Errorf("the CCM may not taint its own node: %v", err)
	}
}

// TestTransientFenceErrorIsRetried: the API server refuses to show the fence
// for a while (its reader's permission is gone): that is no configuration
// error, so the NativeCCM is retried (Reconciling, ProgressingWithRetry; never
// Stalled), nothing is installed unfenced, and it becomes Ready on its own
// once the fence can be read, without a change of its spec.
func TestTransientFenceErrorIsRetried(t *testing.T) {
	const name = "fence-b"
	ctx := ctxT(t)
	if err := k8s.Delete(ctx, fenceReaderBinding()); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := k8s.Create(context.Background(), fenceReaderBinding()); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(restore)

	hcloudSecret(t)
	createNode(t, "fb-1", name, "hcloud://9101")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{Platform: name}})
	waitCondition(t, name, meta.ReadyCondition, metav1.ConditionFalse, gate.GateFailedReason)
	obj := waitCondition(t, name, meta.ReconcilingCondition, metav1.ConditionTrue, meta.ProgressingWithRetryReason)
	if c := conditions.Get(obj, meta.StalledCondition); c != nil {
		t.Fatalf("a transient API error stalled the NativeCCM: %+v", c)
	}
	if !conditions.IsFalse(obj, v1.GatedCondition) {
		t.Errorf("Gated: %+v", conditions.Get(obj, v1.GatedCondition))
	}
	if !strings.Contains(conditions.GetMessage(obj, meta.ReadyCondition), "forbidden") {
		t.Errorf("Ready message does not say why: %s", conditions.GetMessage(obj, meta.ReadyCondition))
	}
	if _, err := getDeployment(t, "native-ccm-"+name); !apierrors.IsNotFound(err) {
		t.Fatalf("installed without its fence: %v", err)
	}
	gen := obj.Generation

	// The permission is back: Ready without any change of the spec.
	restore()
	obj = waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if !conditions.IsTrue(obj, v1.GatedCondition) || obj.Generation != gen {
		t.Fatalf("Gated %+v, generation %d (was %d)", conditions.Get(obj, v1.GatedCondition), obj.Generation, gen)
	}
	if c := conditions.Get(obj, meta.ReconcilingCondition); c != nil {
		t.Errorf("still Reconciling: %+v", c)
	}
}
