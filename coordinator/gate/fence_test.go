package gate_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

func TestFenceValidate(t *testing.T) {
	valid := gate.Fence{NativeCCM: "hcloud", Platform: "hcloud", Username: "system:serviceaccount:kube-system:native-ccm-hcloud", ProviderIDPrefixes: []string{"hcloud://"}}
	tests := []struct {
		name string
		// edit breaks one field of a valid fence.
		edit func(f *gate.Fence)
		// want is a substring of the error; empty: valid.
		want string
	}{
		{name: "valid", edit: func(*gate.Fence) {}},
		{name: "empty platform would match unlabelled nodes", edit: func(f *gate.Fence) { f.Platform = "" }, want: "platform"},
		{name: "platform is not a label value", edit: func(f *gate.Fence) { f.Platform = "a b" }, want: "platform"},
		{name: "no prefixes", edit: func(f *gate.Fence) { f.ProviderIDPrefixes = nil }, want: "providerIDPrefixes"},
		{name: "prefix without scheme", edit: func(f *gate.Fence) { f.ProviderIDPrefixes = []string{"h"} }, want: "providerIDPrefixes[0]"},
		{name: "username is not a ServiceAccount", edit: func(f *gate.Fence) { f.Username = "admin" }, want: "username"},
		{name: "no NativeCCM name", edit: func(f *gate.Fence) { f.NativeCCM = "" }, want: "nativeCCM"},
		{name: "bad label key", edit: func(f *gate.Fence) { f.PlatformLabel = "a b" }, want: "platformLabel"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := valid
			f.ProviderIDPrefixes = append([]string(nil), valid.ProviderIDPrefixes...)
			tc.edit(&f)
			_, _, err := f.Objects()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestPolicyShape(t *testing.T) {
	p, b, err := gate.Policy("hcloud", "hcloud", "system:serviceaccount:kube-system:native-ccm-hcloud", []string{"hcloud://", `it's"odd://`})
	if err != nil {
		t.Fatal(err)
	}
	if got := *p.Spec.FailurePolicy; got != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %s, want Fail (Ignore lets evaluation errors through)", got)
	}
	res := p.Spec.MatchConstraints.ResourceRules[0].Resources
	if strings.Join(res, ",") != "nodes,nodes/status" {
		t.Errorf("resources %v, want nodes and nodes/status", res)
	}
	if b.Spec.PolicyName != p.Name || len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
		t.Errorf("binding %+v does not deny with policy %s", b.Spec, p.Name)
	}
	// Profile values enter CEL only as escaped literals.
	for _, v := range p.Spec.Variables {
		if strings.Contains(v.Expression, `it's"odd`) {
			t.Errorf("variable %s contains an unescaped prefix: %s", v.Name, v.Expression)
		}
	}
}

// fenceFixture is one cluster state for the fence checks.
var fenceNodes = []gatetest.NodeSpec{
	{Name: "fence-own", Platform: "hcloud", ProviderID: "hcloud://1001"},
	{Name: "fence-own-robot", Platform: "hcloud", ProviderID: "hrobot://2002"},
	{Name: "fence-aws", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0abc"},
	{Name: "fence-metal", Platform: "metal", ProviderID: "talos://metal/10.0.0.5"},
	{Name: "fence-uninit", Platform: "", ProviderID: ""},
	{Name: "fence-hcloud-noid", Platform: "hcloud", ProviderID: ""},
	{Name: "fence-hcloud-awsid", Platform: "hcloud", ProviderID: "aws:///eu-west-1a/i-0def"},
	{Name: "fence-unlabelled-hcloudid", Platform: "", ProviderID: "hcloud://3003"},
}

func TestFence(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := e.Client
	c, err := client.New(e.Config, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	const ns, sa = "kube-system", "native-ccm-hcloud"
	if err := gatetest.GrantNativeCCM(ctx, admin, ns, sa); err != nil {
		t.Fatal(err)
	}
	ccmCfg, err := gatetest.ServiceAccountUser(e, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	ccm := kubernetes.NewForConfigOrDie(ccmCfg)
	// Another native CCM the hcloud fence must not touch.
	if err := gatetest.GrantNativeCCM(ctx, admin, ns, "native-ccm-aws"); err != nil {
		t.Fatal(err)
	}
	awsCfg, err := gatetest.ServiceAccountUser(e, ns, "native-ccm-aws")
	if err != nil {
		t.Fatal(err)
	}
	awsCCM := kubernetes.NewForConfigOrDie(awsCfg)

	if err := gatetest.CreateNodes(ctx, admin, fenceNodes...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range fenceNodes {
			_ = admin.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{})
		}
	})

	fence := gate.Fence{NativeCCM: "hcloud", Platform: "hcloud", Username: gatetest.Username(ns, sa), ProviderIDPrefixes: []string{"hcloud://", "hrobot://"}}
	changed, err := gate.EnsurePolicy(ctx, c, fence)
	if err != nil || !changed {
		t.Fatalf("EnsurePolicy: changed=%v err=%v, want a new policy", changed, err)
	}
	if err := gatetest.WaitFence(ctx, ccm, "fence-aws", true); err != nil {
		t.Fatalf("fence never became active: %v", err)
	}
	if changed, err := gate.EnsurePolicy(ctx, c, fence); err != nil || changed {
		t.Fatalf("second EnsurePolicy: changed=%v err=%v, want no write", changed, err)
	}

	taint := `{"spec":{"taints":[{"key":"node.cloudprovider.kubernetes.io/shutdown","effect":"NoSchedule"}]}}`
	condition := `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Probe","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`
	dry := []string{metav1.DryRunAll}
	patch := func(cs kubernetes.Interface, node, body string, sub ...string) error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{DryRun: dry}, sub...)
		return err
	}
	del := func(cs kubernetes.Interface, node string) error {
		return cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: dry})
	}
	update := func(cs kubernetes.Interface, node string, edit func(*corev1.Node)) error {
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(n)
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{DryRun: dry})
		return err
	}

	checks := []struct {
		name string
		// do is the request, dry-run, so that the fixture stays.
		do func() error
		// allow: the request must pass; otherwise it must be denied by the fence.
		allow bool
		// node the denial message must name.
		node string
	}{
		{name: "taint own node", do: func() error { return patch(ccm, "fence-own", addShutdownTaint(t, admin, "fence-own")) }, allow: true},
		{name: "taint own Robot node", do: func() error { return patch(ccm, "fence-own-robot", addShutdownTaint(t, admin, "fence-own-robot")) }, allow: true},
		{name: "replace own node's taints by the shutdown taint", do: func() error { return patch(ccm, "fence-own", taint) }, node: "fence-own"},
		{name: "update own node's taints", do: func() error {
			return update(ccm, "fence-own", func(n *corev1.Node) {
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: gate.ShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule})
			})
		}, allow: true},
		{name: "status of own node", do: func() error { return patch(ccm, "fence-own", condition, "status") }, node: "fence-own"},
		{name: "update own node's annotations", do: func() error {
			return update(ccm, "fence-own", func(n *corev1.Node) { n.Annotations = map[string]string{"x": "y"} })
		}, node: "fence-own"},
		{name: "delete own node", do: func() error { return del(ccm, "fence-own") }, allow: true},
		{name: "delete own Robot node", do: func() error { return del(ccm, "fence-own-robot") }, allow: true},

		{name: "taint aws node", do: func() error { return patch(ccm, "fence-aws", taint) }, node: "fence-aws"},
		{name: "status of aws node", do: func() error { return patch(ccm, "fence-aws", condition, "status") }, node: "fence-aws"},
		{name: "update aws node", do: func() error {
			return update(ccm, "fence-aws", func(n *corev1.Node) { n.Annotations = map[string]string{"x": "y"} })
		}, node: "fence-aws"},
		{name: "delete aws node", do: func() error { return del(ccm, "fence-aws") }, node: "fence-aws"},
		{name: "delete metal node", do: func() error { return del(ccm, "fence-metal") }, node: "fence-metal"},
		{name: "delete uninitialized node", do: func() error { return del(ccm, "fence-uninit") }, node: "fence-uninit"},
		{name: "taint uninitialized node", do: func() error { return patch(ccm, "fence-uninit", taint) }, node: "fence-uninit"},
		{name: "delete hcloud node without providerID", do: func() error { return del(ccm, "fence-hcloud-noid") }, node: "fence-hcloud-noid"},
		{name: "taint hcloud node without providerID", do: func() error { return patch(ccm, "fence-hcloud-noid", taint) }, node: "fence-hcloud-noid"},
		{name: "delete hcloud-labelled node with aws providerID", do: func() error { return del(ccm, "fence-hcloud-awsid") }, node: "fence-hcloud-awsid"},
		{name: "delete unlabelled node with hcloud providerID", do: func() error { return del(ccm, "fence-unlabelled-hcloudid") }, node: "fence-unlabelled-hcloudid"},
		{name: "relabel own node to aws", do: func() error {
			return patch(ccm, "fence-own", `{"metadata":{"labels":{"`+gatetest.PlatformLabel+`":"aws"}}}`)
		}, node: "fence-own"},
		{name: "remove own node's platform label", do: func() error {
			return patch(ccm, "fence-own", `{"metadata":{"labels":{"`+gatetest.PlatformLabel+`":null}}}`)
		}, node: "fence-own"},
		{name: "claim uninitialized node by label", do: func() error {
			return patch(ccm, "fence-uninit", `{"metadata":{"labels":{"`+gatetest.PlatformLabel+`":"hcloud"}}}`)
		}, node: "fence-uninit"},
		{name: "stamp hcloud providerID on uninitialized node", do: func() error {
			return patch(ccm, "fence-uninit", `{"spec":{"providerID":"hcloud://4004"}}`)
		}, node: "fence-uninit"},
		{name: "stamp providerID on labelled node without one", do: func() error {
			return patch(ccm, "fence-hcloud-noid", `{"spec":{"providerID":"hcloud://4005"}}`)
		}, node: "fence-hcloud-noid"},

		{name: "other identities are not fenced (admin deletes aws node)", do: func() error { return del(admin, "fence-aws") }, allow: true},
		{name: "other native CCMs are not fenced by this policy", do: func() error { return patch(awsCCM, "fence-aws", taint) }, allow: true},
	}
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if tc.allow {
				if err != nil {
					t.Fatalf("want allowed, got %v", err)
				}
				return
			}
			if !apierrors.IsForbidden(err) {
				t.Fatalf("want Forbidden by the fence, got %v", err)
			}
			msg := err.Error()
			t.Logf("denied: %s", msg)
			for _, want := range []string{"hybrid-ccm gate", "NativeCCM hcloud", tc.node} {
				if !strings.Contains(msg, want) {
					t.Errorf("denial %q does not mention %q", msg, want)
				}
			}
		})
	}

	t.Run("removed", func(t *testing.T) {
		if err := gate.DeletePolicy(ctx, c, "hcloud"); err != nil {
			t.Fatal(err)
		}
		if err := gate.DeletePolicy(ctx, c, "hcloud"); err != nil {
			t.Fatalf("second delete: %v", err)
		}
		if err := gatetest.WaitFence(ctx, ccm, "fence-aws", false); err != nil {
			t.Fatalf("fence still active after DeletePolicy: %v", err)
		}
	})
}

// addShutdownTaint is the patch cloud-provider's taint helper sends: every
// taint of the node as it is, plus the shutdown taint.
func addShutdownTaint(t *testing.T, admin kubernetes.Interface, node string) string {
	t.Helper()
	n, err := admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	taints := append(n.Spec.Taints, corev1.Taint{Key: gate.ShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule})
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion}, "spec": map[string]any{"taints": taints}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestConfigErrorsAreMarked(t *testing.T) {
	_, _, err := gate.Policy("hcloud", "", "system:serviceaccount:kube-system:x", []string{"hcloud://"})
	if !errors.Is(err, gate.ErrConfig) {
		t.Fatalf("empty platform: %v does not wrap ErrConfig", err)
	}
	s := gate.Sidecar{Release: "r", Namespace: "n", Platform: "p", ProxyPort: 1, HealthPort: 2}
	if err := s.Mutate(&release.Manifests{}); !errors.Is(err, gate.ErrConfig) {
		t.Fatalf("no image: %v does not wrap ErrConfig", err)
	}
}
