package charts_test

import (
	"context"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// cp is the package's control plane (chartstest.CRDDirectoryPaths installed).
var cp chartstest.ControlPlane

func controlPlane(t *testing.T) *testenv.Env {
	t.Helper()
	return cp.Env(t)
}

func stopControlPlane() { cp.Stop() }

// newApplier applies into the namespace the documentation installs into.
func newApplier(t *testing.T, env *testenv.Env) *chartstest.Applier {
	t.Helper()
	return chartstest.NewApplier(t, env, releaseNamespace)
}

// TestUmbrellaServerSideDryRun: every object the umbrella renders, for every
// value set, is accepted by a real API server (server-side apply, dry-run):
// NativeCCMs pass the CRD's schema and CEL rules, the talos.dev
// ServiceAccount its (stand-in) CRD, everything else the built-in validation.
func TestUmbrellaServerSideDryRun(t *testing.T) {
	env := controlPlane(t)
	a := newApplier(t, env)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			m := mustRender(t, hybridCCM, hybridCCM.valuesFor(t, vs.name))
			kinds := map[string]int{}
			createNamespaces(t, a, m)
			for _, obj := range m {
				out, err := a.Apply(context.Background(), obj, true)
				if err != nil {
					t.Errorf("API server rejects: %v", err)
					continue
				}
				kinds[out.GetKind()]++
				if out.GetKind() == "NativeCCM" {
					// the API server's defaulting ran on it
					if install, _, _ := unstructured.NestedString(out.Object, "spec", "install"); install == "" {
						t.Errorf("NativeCCM %s came back without spec.install", out.GetName())
					}
				}
			}
			// talos-ccm's, the coordinator's, the talos.dev one, and helm
			// test's two
			if kinds["Deployment"] != 2 || kinds["ServiceAccount"] != 5 {
				t.Errorf("applied kinds %v", kinds)
			}
			if vs.name == "multi-cloud" && kinds["NativeCCM"] != 4 {
				t.Errorf("NativeCCMs applied: %d, want 4", kinds["NativeCCM"])
			}
		})
	}
}

// TestChartsServerSideDryRun: every object the other charts render on their
// own, for every value set, is accepted by a real API server (server-side
// apply, dry-run).
func TestChartsServerSideDryRun(t *testing.T) {
	env := controlPlane(t)
	a := newApplier(t, env)
	ctx := context.Background()
	// ccm-coordinator's multi-cloud values put the native CCMs' namespace
	// elsewhere; the chart expects it to exist (like the release namespace).
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cloud-controllers"}}
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, c := range []chart{talosCCM, ccmCoordinator, nativeCCM} {
		for _, vs := range valueSets {
			t.Run(string(c)+"/"+vs.name, func(t *testing.T) {
				if c.refusal(vs.name) != "" {
					return // refused before the API server (TestGolden)
				}
				m := mustRender(t, c, c.valuesFor(t, vs.name))
				kinds := map[string]int{}
				createNamespaces(t, a, m)
				for _, obj := range m {
					out, err := a.Apply(ctx, obj, true)
					if err != nil {
						t.Errorf("API server rejects: %v", err)
						continue
					}
					kinds[out.GetKind()]++
				}
				if kinds["Deployment"] != 1 || kinds["ServiceAccount"] == 0 {
					t.Errorf("applied kinds %v", kinds)
				}
			})
		}
	}
}

// TestTalosCCMRBACOnAPIServer: with the chart's ServiceAccount and RBAC
// installed in a real API server, its authorizer allows talos-ccm what its
// controllers do and refuses the rest (SubjectAccessReviews).
func TestTalosCCMRBACOnAPIServer(t *testing.T) {
	env := controlPlane(t)
	a := newApplier(t, env)
	ctx := context.Background()
	m := mustRender(t, talosCCM, nil)
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
		for _, obj := range m.find(kind) {
			if obj.GetAPIVersion() == "talos.dev/v1alpha1" {
				continue
			}
			if _, err := a.Apply(ctx, obj, false); err != nil {
				t.Fatal(err)
			}
		}
	}

	type access struct {
		verb, group, resource, sub, namespace, name string
	}
	allowed := []access{
		{verb: "watch", resource: "nodes"},
		{verb: "update", resource: "nodes", name: "web-1"},
		{verb: "patch", resource: "nodes", sub: "status", name: "web-1"},
		{verb: "create", resource: "events", namespace: "default"},
		{verb: "create", group: "events.k8s.io", resource: "events", namespace: "default"},
		{verb: "list", group: "certificates.k8s.io", resource: "certificatesigningrequests"},
		{verb: "update", group: "certificates.k8s.io", resource: "certificatesigningrequests", sub: "approval", name: "csr-1"},
		{verb: "approve", group: "certificates.k8s.io", resource: "signers", name: "kubernetes.io/kubelet-serving"},
		{verb: "get", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system", name: "talos-ccm"},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system", name: "talos-ccm"},
		{verb: "get", resource: "configmaps", namespace: "kube-system", name: "extension-apiserver-authentication"},
		{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"},
		{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"},
		// node-csr-approval: the cluster's own addresses
		{verb: "watch", group: "networking.k8s.io", resource: "servicecidrs"},
		{verb: "list", resource: "services", namespace: "default", name: "kubernetes"},
		{verb: "watch", group: "discovery.k8s.io", resource: "endpointslices", namespace: "default", name: "kubernetes"},
	}
	denied := []access{
		// cloud-node updates a node and patches its addresses; patching a node
		// is node-ipam-controller's, off by default
		{verb: "patch", resource: "nodes", name: "web-1"},
		{verb: "update", resource: "nodes", sub: "status", name: "web-1"},
		{verb: "delete", resource: "nodes", name: "web-1"},
		{verb: "create", resource: "nodes"},
		{verb: "deletecollection", resource: "nodes"},
		{verb: "approve", group: "certificates.k8s.io", resource: "signers", name: "kubernetes.io/kube-apiserver-client"},
		{verb: "approve", group: "certificates.k8s.io", resource: "signers", name: "kubernetes.io/kube-apiserver-client-kubelet"},
		{verb: "update", group: "certificates.k8s.io", resource: "certificatesigningrequests", sub: "status", name: "csr-1"},
		{verb: "delete", group: "certificates.k8s.io", resource: "certificatesigningrequests", name: "csr-1"},
		// its Lease is created by the chart: no lease create, which RBAC
		// cannot limit by name (it could squat any lease of the namespace)
		{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system"},
		{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system", name: "native-ccm-hcloud"},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system", name: "cloud-controller-manager"},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system", name: "kube-controller-manager"},
		{verb: "get", resource: "secrets", namespace: "kube-system", name: "talos-ccm-talos"},
		{verb: "list", resource: "secrets", namespace: "kube-system"},
		{verb: "get", resource: "configmaps", namespace: "kube-system", name: "kubeadm-config"},
		{verb: "create", resource: "serviceaccounts", sub: "token", namespace: "kube-system", name: "talos-ccm"},
		{verb: "create", resource: "pods", namespace: "kube-system"},
		{verb: "get", group: "hybridccm.io", resource: "nativeccms", name: "hcloud"},
		{verb: "list", resource: "services", namespace: "default"},
		{verb: "list", resource: "services", namespace: "kube-system", name: "kubernetes"},
		{verb: "list", group: "discovery.k8s.io", resource: "endpointslices", namespace: "default"},
	}
	user := "system:serviceaccount:" + releaseNamespace + ":talos-ccm"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNamespace, "system:authenticated"}
	review := func(ctx context.Context, x access) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: x.verb, Group: x.group, Resource: x.resource, Subresource: x.sub, Namespace: x.namespace, Name: x.name,
			},
		}}
		res, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return res.Status.Allowed, nil
	}
	// RBAC objects reach the authorizer through its informers: wait for the first.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return review(ctx, allowed[0])
	}); err != nil {
		t.Fatalf("the chart's RBAC never took effect: %v", err)
	}
	for _, x := range allowed {
		if ok, err := review(ctx, x); err != nil || !ok {
			t.Errorf("%s is not allowed: %+v (err %v)", user, x, err)
		}
	}
	for _, x := range denied {
		if ok, err := review(ctx, x); err != nil || ok {
			t.Errorf("%s is allowed: %+v (err %v)", user, x, err)
		}
	}
}

// createNamespaces applies the Namespaces a chart renders for real (Helm
// creates them first), so that a dry run of what goes into them can succeed.
func createNamespaces(t *testing.T, a *chartstest.Applier, m manifests) {
	t.Helper()
	for _, obj := range m {
		if obj.GetKind() == "Namespace" {
			if _, err := a.Apply(context.Background(), obj, false); err != nil {
				t.Fatalf("namespace %s: %v", obj.GetName(), err)
			}
		}
	}
}

// TestNativeCCMArgsCEL: the CRD refuses, on a real API server, every
// spec.overrides.args entry that is not one --name=value argument, naming it:
// a flag without "=" would take the next argument (the CCM's enforced
// --controllers=cloud-node-lifecycle) as its value. --name=value args pass.
func TestNativeCCMArgsCEL(t *testing.T) {
	env := controlPlane(t)
	a := newApplier(t, env)
	nativeCCM := func(args ...any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "hybridccm.io/v1alpha1", "kind": "NativeCCM",
			"metadata": map[string]any{"name": "args"},
			"spec":     map[string]any{"platform": "hcloud", "overrides": map[string]any{"args": args}},
		}}
	}
	for _, tc := range []struct {
		args []any
		// refused is the arg the error must name; "" for accepted args.
		refused string
	}{
		{args: []any{"--cluster-name"}, refused: "--cluster-name"},
		{args: []any{"--v=2", "--allow-untagged-cloud"}, refused: "--allow-untagged-cloud"},
		{args: []any{"--cluster-name", "x"}, refused: "--cluster-name"},
		{args: []any{"-v=2"}, refused: "-v=2"},
		{args: []any{"--"}, refused: "--"},
		{args: []any{"--=x"}, refused: "--=x"},
		{args: []any{"--cluster-name=", "--allow-untagged-cloud=true", "--cluster-name=--controllers=*"}},
	} {
		_, err := a.Apply(context.Background(), nativeCCM(tc.args...), true)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("args %q: refused: %v", tc.args, err)
		case tc.refused != "" && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.overrides.args") ||
			!strings.Contains(err.Error(), tc.refused+" is not") || !strings.Contains(err.Error(), "--name=true")):
			t.Errorf("args %q: err = %v, want Invalid naming spec.overrides.args and %s", tc.args, err, tc.refused)
		}
	}
	// A value on two lines is refused too (the API server quotes the rule:
	// a message may not span lines).
	if _, err := a.Apply(context.Background(), nativeCCM("--cluster-name=a\nb"), true); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.overrides.args") {
		t.Errorf("a value on two lines: err = %v", err)
	}
}

// TestTakeOverLeaseRBACOnAPIServer: with the Role and RoleBinding the
// umbrella renders for a cloud's takeOver.lease in a real API server, its
// authorizer lets the coordinator's ServiceAccount get that one Lease of
// kube-system and nothing else of it: no other Lease, no list or watch (which
// would show every Lease of the namespace), no write.
func TestTakeOverLeaseRBACOnAPIServer(t *testing.T) {
	env := controlPlane(t)
	a := newApplier(t, env)
	ctx := context.Background()
	m := mustRender(t, hybridCCM, values(t, `clouds: {aws: {enabled: true, takeOver: {lease: kube-system/cloud-controller-manager}}}`))
	for _, kind := range []string{"Role", "RoleBinding"} {
		for _, obj := range m.find(kind) {
			if strings.Contains(obj.GetName(), ":take-over:") {
				if _, err := a.Apply(ctx, obj, false); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	type access struct{ verb, name string }
	allowed := access{"get", "cloud-controller-manager"}
	denied := []access{{"get", "kube-controller-manager"}, {"get", "talos-ccm"}, {"list", ""}, {"watch", ""}, {"watch", "cloud-controller-manager"},
		{"update", "cloud-controller-manager"}, {"patch", "cloud-controller-manager"}, {"delete", "cloud-controller-manager"}, {"create", ""}}
	user := "system:serviceaccount:hybrid-ccm-system:" + hybridCCM.releaseName()
	review := func(ctx context.Context, x access) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:hybrid-ccm-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: x.verb, Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system", Name: x.name,
			},
		}}
		res, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return res.Status.Allowed, nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return review(ctx, allowed)
	}); err != nil {
		t.Fatalf("the take-over Role never let %s get Lease kube-system/cloud-controller-manager: %v", user, err)
	}
	for _, x := range denied {
		if ok, err := review(ctx, x); err != nil || ok {
			t.Errorf("%s may %s Lease kube-system/%q (err %v)", user, x.verb, x.name, err)
		}
	}
}
