package doctor_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/cli"
	"github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/doctor"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// helmTest is a chart's helm test as it renders: the objects it installs
// (ServiceAccount, RBAC) and the test pod's ServiceAccount and arguments.
type helmTest struct {
	objects       []*unstructured.Unstructured
	podNamespace  string
	podSA         string
	args          []string
	podNamespaced bool
}

// renderHelmTest renders templates/tests/doctor.yaml of chart as release
// name in namespace ns with values.
func renderHelmTest(t *testing.T, chart, name, ns string, values map[string]any) helmTest {
	t.Helper()
	ch, err := loader.Load(filepath.Join(testenv.RepoRoot(), "charts", chart))
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: name, Namespace: ns, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		t.Fatal(err)
	}
	var ht helmTest
	for _, doc := range strings.Split(files[chart+"/templates/tests/doctor.yaml"], "\n---") {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetKind() != "Pod" {
			ht.objects = append(ht.objects, &u)
			continue
		}
		if u.GetAnnotations()["helm.sh/hook"] != "test" {
			t.Fatalf("%s: the test pod is not a test hook: %v", chart, u.GetAnnotations())
		}
		var pod corev1.Pod
		b, _ := yaml.Marshal(u.Object)
		if err := yaml.Unmarshal(b, &pod); err != nil {
			t.Fatal(err)
		}
		ht.podNamespace, ht.podSA, ht.args = pod.Namespace, pod.Spec.ServiceAccountName, pod.Spec.Containers[0].Args
		ht.podNamespaced = true
	}
	if !ht.podNamespaced {
		t.Fatalf("%s renders no test pod", chart)
	}
	return ht
}

// kubeconfigFor writes a kubeconfig file for cfg (a client certificate).
func kubeconfigFor(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDoctorComponent is the charts' helm test against a real API server:
// each chart's test ServiceAccount and RBAC as the chart renders them, and
// hybridctl doctor run with the test pod's arguments as that ServiceAccount.
// On a working install it reports nothing and needs no right it lacks (no
// "cannot ..." note); when talos-ccm or the coordinator has no ready
// replica, or a NativeCCM is not Ready, it exits non-zero naming it. The
// ServiceAccounts can read nothing else (Secrets, pods).
func TestDoctorComponent(t *testing.T) {
	ctx := context.Background()
	c, err := doctor.NewClient(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	// namespaces of their own: the package's other tests count what is
	// cluster-wide, so everything cluster-wide made here is deleted after
	const talosNS, releaseNS, coordNS = "talos-test", "helm-test", "ccm-test-system"
	for _, ns := range []string{talosNS, releaseNS, coordNS} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	var cleanup []client.Object
	t.Cleanup(func() {
		for _, o := range cleanup {
			if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("clean up %T %s: %v", o, o.GetName(), err)
			}
		}
	})
	made := func(objs ...client.Object) {
		create(t, c, objs...)
		cleanup = append(cleanup, objs...)
	}
	tests := map[string]helmTest{
		doctor.ComponentTalosCCM:    renderHelmTest(t, "talos-ccm", "talos-ccm", talosNS, nil),
		doctor.ComponentCoordinator: renderHelmTest(t, "ccm-coordinator", "hybrid-ccm", releaseNS, map[string]any{"namespace": coordNS}),
	}
	users := map[string]string{}
	for comp, ht := range tests {
		for _, o := range ht.objects {
			made(o)
		}
		if ht.podNamespace != map[string]string{doctor.ComponentTalosCCM: talosNS, doctor.ComponentCoordinator: releaseNS}[comp] {
			t.Errorf("%s: test pod in namespace %s, want the release namespace (helm test --logs reads it there)", comp, ht.podNamespace)
		}
		cfg, err := env.AddUser("system:serviceaccount:"+ht.podNamespace+":"+ht.podSA, "system:serviceaccounts", "system:serviceaccounts:"+ht.podNamespace)
		if err != nil {
			t.Fatal(err)
		}
		users[comp] = kubeconfigFor(t, cfg)
	}
	// run is the test pod's hybridctl doctor, as its ServiceAccount
	run := func(comp string) (string, error) {
		cmd := cli.NewRootCommand()
		var buf strings.Builder
		cmd.SetOut(&buf)
		cmd.SetErr(&buf)
		cmd.SetArgs(append(append([]string{}, tests[comp].args...), "--kubeconfig", users[comp]))
		err := cmd.ExecuteContext(ctx)
		return buf.String(), err
	}

	// a working install: an initialized node, talos-ccm and the coordinator
	// each with a ready replica leading, the fence, a Ready NativeCCM
	renewed := time.Now().Add(time.Hour)
	talos := ccmDeployment("talos-ccm", nil, "ghcr.io/hybrid-ccm/talos-ccm:v0.1.0", "--cloud-provider=talos",
		"--leader-elect-resource-name=talos-ccm", "--leader-elect-resource-namespace="+talosNS)
	talos.Namespace = talosNS
	coordinator := ccmDeployment("hybrid-ccm", map[string]string{"app.kubernetes.io/name": "ccm-coordinator"}, "ghcr.io/hybrid-ccm/ccm-coordinator:v0.1.0")
	coordinator.Namespace = coordNS
	nccm := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "helmtest"}, Spec: v1.NativeCCMSpec{Platform: "helmtest"}}
	made(node("helmtest-1", "hcloud", "hcloud://77", false, "10.250.0.0/24"), talos, coordinator,
		lease(talosNS, "talos-ccm", "cp-1_0f3c", renewed), lease(coordNS, names.CoordinatorLease, "hybrid-ccm-6d9f_1a2b", renewed), nccm)
	setReady(t, c, talosNS, "talos-ccm", 1)
	setReady(t, c, coordNS, "hybrid-ccm", 1)
	fence := gate.Fence{Namespace: coordNS}
	if _, err := gate.EnsureFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteFence(ctx, c, fence) })
	setCondition := func(status metav1.ConditionStatus, reason, msg string) {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKeyFromObject(nccm), nccm); err != nil {
			t.Fatal(err)
		}
		nccm.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.Now()}}
		if err := c.Status().Update(ctx, nccm); err != nil {
			t.Fatal(err)
		}
	}
	setCondition(metav1.ConditionTrue, "Installed", "release native-ccm-helmtest deployed")

	inspected := map[string]string{
		doctor.ComponentTalosCCM:    "Inspected talos-ccm in namespace " + talosNS + ", ",
		doctor.ComponentCoordinator: "Inspected ccm-coordinator in namespace " + coordNS + ", the fence, ",
	}
	for _, comp := range doctor.Components {
		out, err := run(comp)
		if err != nil || !strings.Contains(out, "No problems found.") || strings.Contains(out, "note:") || !strings.Contains(out, inspected[comp]) {
			t.Errorf("%s, working install: helm test's doctor = %v\n%s", comp, err, out)
		}
	}

	// broken: talos-ccm without a ready replica, the coordinator too, a
	// NativeCCM not Ready; each test names its own
	setReady(t, c, talosNS, "talos-ccm", 0)
	setReady(t, c, coordNS, "hybrid-ccm", 0)
	setCondition(metav1.ConditionFalse, "CredentialsMissing", "secret "+coordNS+"/helmtest-credentials not found")
	want := map[string][]string{
		doctor.ComponentTalosCCM:    {"ControllerNotReady", "deployment/" + talosNS + "/talos-ccm", "talos-ccm: 0 of 1 replicas ready"},
		doctor.ComponentCoordinator: {"ControllerNotReady", "deployment/" + coordNS + "/hybrid-ccm", "NativeCCMNotReady", "nativeccm/helmtest", "CredentialsMissing", "2 problem(s)"},
	}
	for _, comp := range doctor.Components {
		out, err := run(comp)
		if !errors.Is(err, cli.ErrFindings) {
			t.Errorf("%s, broken: want ErrFindings, got %v\n%s", comp, err, out)
		}
		for _, s := range want[comp] {
			if !strings.Contains(out, s) {
				t.Errorf("%s, broken: report lacks %q:\n%s", comp, s, out)
			}
		}
		if strings.Contains(out, "note:") {
			t.Errorf("%s, broken: a note (a right the test lacks?):\n%s", comp, out)
		}
	}
	// no coordinator at all in its namespace
	if err := c.Delete(ctx, coordinator); err != nil {
		t.Fatal(err)
	}
	if out, err := run(doctor.ComponentCoordinator); !errors.Is(err, cli.ErrFindings) || !strings.Contains(out, "CoordinatorNotInstalled") {
		t.Errorf("no coordinator: %v\n%s", err, out)
	}

	// least privilege: nothing else is readable
	for comp, kc := range users {
		cfg, err := clientcmd.BuildConfigFromFlags("", kc)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := client.New(cfg, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ns := range []string{talosNS, coordNS, releaseNS} {
			if err := sc.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
				t.Errorf("%s's test ServiceAccount lists Secrets of %s: %v", comp, ns, err)
			}
			if err := sc.List(ctx, &corev1.PodList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
				t.Errorf("%s's test ServiceAccount lists pods of %s: %v", comp, ns, err)
			}
		}
	}
}
