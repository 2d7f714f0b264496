package gate_test

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/cloud-provider/controllers/nodelifecycle"
	cloudnodeutil "k8s.io/cloud-provider/node/helpers"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
)

// TestNodeSpecFieldsAreAllCompared fails when core/v1 NodeSpec gains a field
// the fence does not compare (a Kubernetes upgrade): a native CCM could change
// it on its own nodes.
func TestNodeSpecFieldsAreAllCompared(t *testing.T) {
	typ := reflect.TypeOf(corev1.NodeSpec{})
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if !slices.Contains(gate.NodeSpecFields, name) {
			t.Errorf("NodeSpec field %s is not compared by the fence", name)
		}
	}
	if gate.ShutdownTaintKey != nodelifecycle.ShutdownTaint.Key || gate.ShutdownTaintEffect != string(nodelifecycle.ShutdownTaint.Effect) {
		t.Errorf("the fence allows %s:%s, cloud-node-lifecycle writes %s:%s", gate.ShutdownTaintKey, gate.ShutdownTaintEffect,
			nodelifecycle.ShutdownTaint.Key, nodelifecycle.ShutdownTaint.Effect)
	}
}

// TestFenceOwnNodeChanges: with exactly the RBAC the coordinator grants and
// through the real ccm-gate binary (forwarded ServiceAccount token), a native
// CCM may change on its own node only the shutdown taint, and delete it. Every
// other change is denied by the fence with a message naming the field, and
// the node is left as it was.
func TestFenceOwnNodeChanges(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := e.Client
	const ns, sa = "kube-system", "native-ccm-owned"
	if err := gatetest.GrantLifecycle(ctx, admin, ns, sa); err != nil {
		t.Fatal(err)
	}
	token, err := gatetest.ServiceAccountToken(ctx, admin, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const platform = "owned"
	if err := gatetest.InstallFence(ctx, c, ns); err != nil {
		t.Fatal(err)
	}
	remove, err := gatetest.Confine(ctx, c, gate.Fence{Namespace: ns}, "owned", platform, "hcloud://")
	if remove != nil {
		t.Cleanup(remove)
	}
	if err != nil {
		t.Fatal(err)
	}

	// The node as kubelet, talos-ccm and an admin left it.
	adminTaint := corev1.Taint{Key: "example.com/maintenance", Value: "admin", Effect: corev1.TaintEffectNoExecute}
	spec := gatetest.NodeSpec{Name: "owned-1", Platform: platform, ProviderID: "hcloud://7001", Labels: map[string]string{"topology.kubernetes.io/zone": "fsn1"}}
	gone := gatetest.NodeSpec{Name: "owned-gone", Platform: platform, ProviderID: "hcloud://7002"}
	foreign := gatetest.NodeSpec{Name: "owned-foreign", Platform: "aws", ProviderID: "aws:///a/i-1"}
	if err := gatetest.CreateNodes(ctx, admin, spec, gone, foreign); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range []string{spec.Name, gone.Name, foreign.Name} {
			_ = admin.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	node, err := admin.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Annotations = map[string]string{
		"alpha.kubernetes.io/provided-node-ip":                   "10.0.0.1",
		"node.cloudprovider.kubernetes.io/transformations-owned": "labels=a",
	}
	node.Spec.Taints = append(node.Spec.Taints, adminTaint)
	if _, err := admin.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	direct := kubernetes.NewForConfigOrDie(&rest.Config{Host: e.Config.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: e.Config.CAData}})
	if err := gatetest.WaitFence(ctx, direct, foreign.Name, true); err != nil {
		t.Fatal(err)
	}
	// A fence of an earlier test (without platform owned's prefixes) may
	// still be in effect for a moment, and denies for the foreign node too:
	// wait until a change only this one allows (the shutdown taint, dry run)
	// is allowed.
	shutdown := []byte(`[{"op":"add","path":"/spec/taints/-","value":{"key":"` + gate.ShutdownTaintKey + `","effect":"` + gate.ShutdownTaintEffect + `"}}]`)
	if err := gatetest.WaitFenceAllows(ctx, func() error {
		_, err := direct.CoreV1().Nodes().Patch(ctx, spec.Name, types.JSONPatchType, shutdown, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}); err != nil {
		t.Fatalf("the fence never let NativeCCM owned taint its node %s: %v", spec.Name, err)
	}

	dir := t.TempDir()
	bin, err := gatetest.BuildGate(dir)
	if err != nil {
		t.Fatal(err)
	}
	upstream := &rest.Config{Host: e.Config.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: e.Config.CAData}}
	g, err := gatetest.StartGate(bin, dir, platform, upstream, token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	ccm := kubernetes.NewForConfigOrDie(g.Config)

	before, err := admin.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	taintsJSON := func(extra string) string {
		var parts []string
		for _, t := range before.Spec.Taints {
			if t.Key == adminTaint.Key {
				continue
			}
			parts = append(parts, `{"key":"`+t.Key+`","effect":"`+string(t.Effect)+`"}`)
		}
		if extra != "" {
			parts = append(parts, extra)
		}
		return `{"spec":{"taints":[` + strings.Join(parts, ",") + `]}}`
	}
	forbidden := []struct {
		name string
		// patch is a merge patch (or strategic with sub "status").
		patch string
		// sub is the subresource.
		sub string
		// want are substrings of the denial.
		want []string
	}{
		{name: "add the control-plane role label", patch: `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`,
			want: []string{"may not change the label(s) node-role.kubernetes.io/control-plane of node owned-1"}},
		{name: "change a topology label", patch: `{"metadata":{"labels":{"topology.kubernetes.io/zone":"nbg1"}}}`,
			want: []string{"label(s) topology.kubernetes.io/zone"}},
		{name: "remove a label", patch: `{"metadata":{"labels":{"kubernetes.io/hostname":null}}}`,
			want: []string{"label(s) kubernetes.io/hostname"}},
		{name: "remove an admin's NoExecute taint", patch: taintsJSON(""),
			want: []string{"may not change the taint(s) example.com/maintenance:NoExecute of node owned-1"}},
		{name: "add another taint", patch: taintsJSON(`{"key":"example.com/other","effect":"NoSchedule"},{"key":"example.com/maintenance","value":"admin","effect":"NoExecute"}`),
			want: []string{"taint(s) example.com/other:NoSchedule"}},
		{name: "shutdown taint with a value", patch: taintsJSON(`{"key":"example.com/maintenance","value":"admin","effect":"NoExecute"},{"key":"` + gate.ShutdownTaintKey + `","value":"x","effect":"NoSchedule"}`),
			want: []string{"the value of the taint " + gate.ShutdownTaintKey}},
		{name: "cordon", patch: `{"spec":{"unschedulable":true}}`, want: []string{"may not change spec.unschedulable of node owned-1"}},
		{name: "set podCIDR", patch: `{"spec":{"podCIDR":"10.244.9.0/24","podCIDRs":["10.244.9.0/24"]}}`, want: []string{"spec.podCIDR"}},
		{name: "rewrite provided-node-ip", patch: `{"metadata":{"annotations":{"alpha.kubernetes.io/provided-node-ip":"192.0.2.1"}}}`,
			want: []string{"may not change the annotation(s) alpha.kubernetes.io/provided-node-ip of node owned-1"}},
		{name: "rewrite talos-ccm's annotation", patch: `{"metadata":{"annotations":{"node.cloudprovider.kubernetes.io/transformations-owned":null}}}`,
			want: []string{"annotation(s) node.cloudprovider.kubernetes.io/transformations-owned"}},
		{name: "add a finalizer", patch: `{"metadata":{"finalizers":["example.com/keep"]}}`, want: []string{"metadata.finalizers"}},
		{name: "add an owner", patch: `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"x","uid":"6f1e0c6e-0000-4000-8000-000000000001"}]}}`,
			want: []string{"metadata.ownerReferences"}},
		{name: "all of issue 14 in one patch", patch: `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""},"annotations":{"alpha.kubernetes.io/provided-node-ip":"192.0.2.1"}},"spec":{"unschedulable":true,"taints":[]}}`,
			want: []string{"may not change"}},
		{name: "status (not granted by the coordinator)", patch: `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"x"}]}}`, sub: "status",
			want: []string{"status"}},
	}
	for _, tc := range forbidden {
		t.Run(tc.name, func(t *testing.T) {
			var sub []string
			if tc.sub != "" {
				sub = []string{tc.sub}
			}
			_, err := ccm.CoreV1().Nodes().Patch(ctx, spec.Name, types.MergePatchType, []byte(tc.patch), metav1.PatchOptions{}, sub...)
			if !apierrors.IsForbidden(err) {
				t.Fatalf("want Forbidden, got %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("denial %q does not mention %q", err, w)
				}
			}
			after, err := admin.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if after.ResourceVersion != before.ResourceVersion {
				t.Fatalf("node changed: %+v", after)
			}
		})
	}

	// What cloud-node-lifecycle does, with the helpers it uses.
	hasShutdown := func() bool {
		n, err := admin.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x == adminTaint }) {
			t.Fatalf("the admin's taint is gone: %+v", n.Spec.Taints)
		}
		return slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == gate.ShutdownTaintKey })
	}
	t.Run("add the shutdown taint", func(t *testing.T) {
		if err := cloudnodeutil.AddOrUpdateTaintOnNode(ccm, spec.Name, nodelifecycle.ShutdownTaint); err != nil {
			t.Fatal(err)
		}
		if !hasShutdown() {
			t.Fatal("no shutdown taint")
		}
	})
	t.Run("remove the shutdown taint", func(t *testing.T) {
		// A read at resourceVersion 0 (from the watch cache, as the controller
		// reads) may not show the taint just added yet: RemoveTaintOffNode
		// would then see nothing to remove. Wait until it does.
		var n *corev1.Node
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			var err error
			n, err = ccm.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{ResourceVersion: "0"})
			if err != nil {
				return false, err
			}
			return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gate.ShutdownTaintKey }), nil
		})
		if err != nil {
			t.Fatalf("the shutdown taint never showed at resourceVersion 0: %v", err)
		}
		if err := cloudnodeutil.RemoveTaintOffNode(ccm, spec.Name, n, nodelifecycle.ShutdownTaint); err != nil {
			t.Fatal(err)
		}
		if hasShutdown() {
			t.Fatal("shutdown taint still there")
		}
	})
	t.Run("delete the gone node", func(t *testing.T) {
		if err := ccm.CoreV1().Nodes().Delete(ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Nodes().Get(ctx, gone.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("node still there: %v", err)
		}
	})
}
