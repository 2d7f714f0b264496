package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// renderChart renders a chart of charts/ with its default values (the Helm SDK's
// engine, as `helm template` does) and returns the objects.
func renderChart(t *testing.T, name, namespace string) []*unstructured.Unstructured {
	t.Helper()
	return renderChartWith(t, name, namespace, map[string]any{})
}

// renderChartWith renders a chart of charts/ with values.
func renderChartWith(t *testing.T, name, namespace string, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	return renderChartAs(t, name, name, namespace, values)
}

// renderChartAs renders a chart of charts/ as release rel with values.
func renderChartAs(t *testing.T, name, rel, namespace string, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	ch, err := loader.Load(filepath.Join(testenv.RepoRoot(), "charts", name))
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(ch, values,
		chartutil.ReleaseOptions{Name: rel, Namespace: namespace, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for path, content := range files {
		if !strings.HasSuffix(path, ".yaml") {
			continue
		}
		for _, doc := range strings.Split(content, "\n---") {
			var m map[string]any
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if len(m) == 0 {
				continue
			}
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
	return out
}

// kubeconfigFor writes a kubeconfig for a rest.Config (client certificate user).
func kubeconfigFor(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "x"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// applyCoordinatorChart applies what the ccm-coordinator chart renders with its
// default values (installed as the umbrella chart installs it, into
// kube-system) that decides what the coordinator may do: its namespace,
// ServiceAccount, RBAC and admission policy. It returns the coordinator's
// namespace and a client configuration authenticated as its ServiceAccount.
func applyCoordinatorChart(t *testing.T, c client.Client) (string, *rest.Config) {
	t.Helper()
	ns, cfg, _ := applyCoordinatorChartAs(t, c, "ccm-coordinator", map[string]any{})
	return ns, cfg
}

// applyCoordinatorChartAs is applyCoordinatorChart for release rel (a
// coordinator of its own: its ServiceAccount, RBAC and admission policy are
// named after rel) with values. It returns the objects it rendered too.
func applyCoordinatorChartAs(t *testing.T, c client.Client, rel string, values map[string]any) (string, *rest.Config, []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	var sa, ns string
	var probe *admissionregistrationv1.ValidatingAdmissionPolicy
	objs := renderChartAs(t, "ccm-coordinator", rel, "kube-system", values)
	// the namespace first, as Helm orders it
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int {
		return cmpBool(b.GetKind() == "Namespace", a.GetKind() == "Namespace")
	})
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount":
			if o.GetName() != rel { // helm test's
				continue
			}
			sa, ns = o.GetName(), o.GetNamespace()
		case "ValidatingAdmissionPolicy":
			probe = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			probe.Name = o.GetName()
		case "Namespace", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ValidatingAdmissionPolicyBinding":
		default:
			continue
		}
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	if sa == "" || ns == "" || probe == nil {
		t.Fatalf("chart renders no ServiceAccount (%q/%q) or admission policy", ns, sa)
	}
	user := "system:serviceaccount:" + ns + ":" + sa
	cfg, err := env.AddUser(user, "system:serviceaccounts", "system:serviceaccounts:"+ns, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	// A new policy takes the API server a moment to enforce: wait until it
	// denies the coordinator something RBAC allows it.
	cc, err := client.New(cfg, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe", Namespace: ns}}
		return apierrors.IsForbidden(cc.Create(ctx, sa, client.DryRunAll)), nil
	})
	if err != nil {
		t.Fatalf("admission policy %s not enforced", probe.Name)
	}
	return ns, cfg, objs
}

// ccm-coordinator runs with exactly the RBAC and admission policy its chart
// ships: installing a native CCM (with the RBAC it hands on, which the API
// server only lets it grant through the bind rights it holds), fencing it,
// reporting status and uninstalling must all work with that identity and
// nothing more.
func TestCoordinatorWorksWithItsChartRBAC(t *testing.T) {
	ctx := context.Background()
	c, err := controllerClient()
	if err != nil {
		t.Fatal(err)
	}
	ns, cfg := applyCoordinatorChart(t, c)
	logs := &testenv.Buffer{}
	cmd := exec.Command(filepath.Join(binaries, "ccm-coordinator"), "--kubeconfig="+kubeconfigFor(t, cfg),
		"--release-namespace="+ns, "--metrics-addr=0", "--health-addr=0", "--helm-wait=false",
		"--uninstall-grace-period=1s", "--wait-interval=1s")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("ccm-coordinator logs:\n%s", tail(logs.String(), 8000))
		}
	})

	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hcloud", Namespace: ns}, StringData: map[string]string{"token": "t"}}); err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rbac-hcloud-1", Labels: map[string]string{names.PlatformLabel: "hcloud"}},
		Spec: corev1.NodeSpec{ProviderID: "hcloud://77"}}
	if err := c.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), n) })
	nccm := &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "hcloud"}, Spec: v1alpha1.NativeCCMSpec{Platform: "hcloud"}}
	// its fence grant, made with it (as the hybrid-ccm chart does)
	if err := gate.EnsureGrant(ctx, c, gate.GrantFor(nccm, ns)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteGrant(context.Background(), c, "hcloud") })
	if err := c.Create(ctx, nccm); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.NativeCCM
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: "hcloud"}, &got); err != nil {
			return false, nil
		}
		// Installed with the chart's RBAC; Ready needs the CCM's pods running
		// (no kubelet here: test/oncluster runs them), so it says which it waits for.
		i := apimeta.FindStatusCondition(got.Status.Conditions, v1alpha1.InstalledCondition)
		r := apimeta.FindStatusCondition(got.Status.Conditions, "Ready")
		return i != nil && i.Status == metav1.ConditionTrue && got.Status.Release != nil &&
			r != nil && r.Status == metav1.ConditionFalse && r.Reason == v1alpha1.NoRunningPodsReason, nil
	})
	if err != nil {
		t.Fatalf("NativeCCM hcloud not installed with the chart's RBAC (and waiting for its pods): %+v", got.Status.Conditions)
	}
	var dep unstructured.Unstructured
	dep.SetAPIVersion("apps/v1")
	dep.SetKind("Deployment")
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: got.ReleaseName()}, &dep); err != nil {
		t.Fatalf("release Deployment: %v", err)
	}
	// the gate came with it: the fence and the grant checked with this
	// identity, status.gate written (the fence itself is the chart's), the
	// sidecar in the pod
	if g := apimeta.FindStatusCondition(got.Status.Conditions, v1alpha1.GatedCondition); g == nil || g.Status != metav1.ConditionTrue {
		t.Fatalf("Gated condition: %+v", g)
	}
	if g := got.Status.Gate; g == nil || g.Policy != gate.DefaultFenceName || g.ServiceAccount != ns+"/"+got.ReleaseName() || !slices.Equal(g.ProviderIDPrefixes, []string{"hcloud://", "hrobot://"}) {
		t.Fatalf("status.gate %+v", g)
	}
	// the native CCM got least privilege on nodes (patch and delete, no
	// update): bound to the ClusterRole the chart ships, which has exactly the
	// rules the coordinator means to grant
	var crb rbacv1.ClusterRoleBinding
	if err := c.Get(ctx, client.ObjectKey{Name: got.ReleaseName()}, &crb); err != nil {
		t.Fatalf("native CCM ClusterRoleBinding: %v", err)
	}
	var role rbacv1.ClusterRole
	if err := c.Get(ctx, client.ObjectKey{Name: crb.RoleRef.Name}, &role); err != nil || crb.RoleRef.Name != release.LifecycleClusterRole {
		t.Fatalf("native CCM ClusterRole %s: %v", crb.RoleRef.Name, err)
	}
	if !equality.Semantic.DeepEqual(role.Rules, release.LifecycleRules()) {
		t.Fatalf("chart's %s rules %+v, want release.LifecycleRules %+v", role.Name, role.Rules, release.LifecycleRules())
	}
	var lbRole rbacv1.ClusterRole
	if err := c.Get(ctx, client.ObjectKey{Name: release.LoadBalancerClusterRole}, &lbRole); err != nil {
		t.Fatalf("chart's %s: %v", release.LoadBalancerClusterRole, err)
	}
	if !equality.Semantic.DeepEqual(lbRole.Rules, release.LoadBalancerRules()) {
		t.Fatalf("chart's %s rules %+v, want release.LoadBalancerRules %+v", lbRole.Name, lbRole.Rules, release.LoadBalancerRules())
	}
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "nodes") && !slices.Equal(r.Verbs, []string{"get", "list", "watch", "patch", "delete"}) {
			t.Fatalf("native CCM may %v nodes", r.Verbs)
		}
	}
	// Its Lease was created ahead, with no holder; the native CCM may take
	// it (get, update) but create no lease: not talos-ccm's, nor any other.
	ccmCfg, err := env.AddUser("system:serviceaccount:"+ns+":"+got.ReleaseName(), "system:serviceaccounts", "system:serviceaccounts:"+ns, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	ccm, err := client.New(ccmCfg, client.Options{Scheme: controller.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	var lease coordinationv1.Lease
	if err := ccm.Get(ctx, client.ObjectKey{Namespace: ns, Name: got.ReleaseName()}, &lease); err != nil {
		t.Fatalf("the native CCM cannot read its Lease: %v", err)
	}
	if lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
		t.Fatalf("Lease created with holder %q", *lease.Spec.HolderIdentity)
	}
	lease.Spec.HolderIdentity = ptr.To(got.ReleaseName() + "-pod_1")
	if err := ccm.Update(ctx, &lease); err != nil {
		t.Fatalf("the native CCM cannot take its Lease: %v", err)
	}
	for _, squat := range []client.ObjectKey{{Namespace: "kube-system", Name: "talos-ccm"}, {Namespace: ns, Name: "talos-ccm"}, {Namespace: ns, Name: "native-ccm-other"}} {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: squat.Namespace, Name: squat.Name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("evil"), LeaseDurationSeconds: ptr.To[int32](365 * 24 * 3600)}}
		if err := ccm.Create(ctx, l, client.DryRunAll); !apierrors.IsForbidden(err) {
			t.Errorf("native CCM creates Lease %s: %v", squat, err)
		}
	}
	// The fence holds for it: its RBAC lets it patch nodes, the fence refuses a
	// node of another platform.
	foreign := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rbac-aws-1", Labels: map[string]string{names.PlatformLabel: "aws"}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///a/i-77"}}
	if err := c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), foreign) })
	if err := ccm.Delete(ctx, foreign, client.DryRunAll); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "hybrid-ccm gate: NativeCCM hcloud") {
		t.Fatalf("native CCM deletes an aws node: %v", err)
	}
	inits, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "initContainers")
	sidecar := false
	for _, c := range inits {
		if m, ok := c.(map[string]any); ok && m["name"] == gate.SidecarName && m["restartPolicy"] == "Always" {
			sidecar = true
		}
	}
	if !sidecar {
		t.Fatalf("release pod lacks the %s native sidecar: %v", gate.SidecarName, inits)
	}

	// deletion: the finalizer uninstalls with the same identity (and removes
	// the Lease it created)
	if err := c.Delete(ctx, nccm); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: "hcloud"}, &got)
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("NativeCCM not removed: %+v", got.Status.Conditions)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: got.ReleaseName()}, &dep); !apierrors.IsNotFound(err) {
		t.Fatalf("release Deployment left behind: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: got.ReleaseName()}, &lease); !apierrors.IsNotFound(err) {
		t.Fatalf("release Lease left behind: %v", err)
	}
	// the fence is the chart's and stays for the next native CCM
	if err := gate.CheckFence(ctx, c, gate.Fence{Namespace: ns}); err != nil {
		t.Fatalf("fence after the uninstall: %v", err)
	}
}

func controllerClient() (client.Client, error) {
	return client.New(env.Config, client.Options{Scheme: controller.NewScheme()})
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
