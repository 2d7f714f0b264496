package gate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
)

const regionLabel = "topology.kubernetes.io/region"

var domainNodes = []gatetest.NodeSpec{
	{Name: "dom-eu", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0e1", Labels: map[string]string{regionLabel: "eu-west-1"}},
	{Name: "dom-eu-2", Platform: "aws", ProviderID: "aws:///eu-west-1b/i-0e2", Labels: map[string]string{regionLabel: "eu-west-1"}},
	{Name: "dom-us", Platform: "aws", ProviderID: "aws:///us-east-1a/i-0u1", Labels: map[string]string{regionLabel: "us-east-1"}},
	{Name: "dom-noregion", Platform: "aws", ProviderID: "aws:///x/i-0n1"},
	// a value that only looks like eu-west-1 once lower-cased and punctuated
	{Name: "dom-lookalike", Platform: "aws", ProviderID: "aws:///x/i-0l1", Labels: map[string]string{regionLabel: "EU_West.1"}},
	{Name: "dom-hc-p1", Platform: "hcloud", ProviderID: "hcloud://71", Labels: map[string]string{v1.DomainLabel: "p1"}},
	{Name: "dom-hc-p2", Platform: "hcloud", ProviderID: "hcloud://72", Labels: map[string]string{v1.DomainLabel: "p2"}},
}

// TestFenceDomains: the fence's checks across domains of one platform, for
// NativeCCMs with a domain, one without (the whole platform, as before
// domains), the members of a split NativeCCM, and members whose NativeCCM
// does not split; and a node relabelled into another domain.
func TestFenceDomains(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := e.Client
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "kube-system"
	if err := gatetest.CreateNodes(ctx, admin, domainNodes...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range domainNodes {
			_ = admin.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{})
		}
	})
	fence := gate.Fence{Namespace: ns}
	if _, err := gate.EnsureFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteFence(context.Background(), c, fence) })

	region := func(vs ...string) gate.DomainGrant {
		return gate.DomainGrant{Require: map[string][]string{regionLabel: vs}}
	}
	grants := []gate.Grant{
		{NativeCCM: "d-eu", Platform: "aws", Domain: region("eu-west-1")},
		{NativeCCM: "d-us", Platform: "aws", Domain: region("us-east-1")},
		{NativeCCM: "d-all", Platform: "aws"},
		{NativeCCM: "d-split", Platform: "aws", Domain: gate.DomainGrant{SplitBy: regionLabel}},
		{NativeCCM: "d-p1", Platform: "hcloud", Domain: gate.DomainGrant{Require: map[string][]string{v1.DomainLabel: {"p1"}}}},
	}
	for _, g := range grants {
		g.Namespace = ns
		if err := gate.EnsureGrant(ctx, c, g); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = gate.DeleteGrant(context.Background(), c, g.NativeCCM) })
	}
	identity := func(sa string) kubernetes.Interface {
		t.Helper()
		if err := gatetest.GrantNativeCCM(ctx, admin, ns, sa); err != nil {
			t.Fatal(err)
		}
		cfg, err := gatetest.ServiceAccountUser(e, ns, sa)
		if err != nil {
			t.Fatal(err)
		}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	eu, us, all := identity("native-ccm-d-eu"), identity("native-ccm-d-us"), identity("native-ccm-d-all")
	splitEU, splitUS := identity("native-ccm-d-split--eu-west-1"), identity("native-ccm-d-split--us-east-1")
	notSplit := identity("native-ccm-d-eu--us-east-1")
	p1 := identity("native-ccm-d-p1")
	if err := gatetest.WaitFence(ctx, eu, "dom-us", true); err != nil {
		t.Fatalf("fence never became active: %v", err)
	}
	if err := gatetest.WaitFenceAllows(ctx, func() error {
		return eu.CoreV1().Nodes().Delete(ctx, "dom-eu", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}); err != nil {
		t.Fatalf("the fence of this test never came into effect: %v", err)
	}

	dry := []string{metav1.DryRunAll}
	del := func(cs kubernetes.Interface, node string) func() error {
		return func() error { return cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: dry}) }
	}
	taint := func(cs kubernetes.Interface, node string) func() error {
		return func() error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(addShutdownTaint(t, admin, node)), metav1.PatchOptions{DryRun: dry})
			return err
		}
	}
	status := func(cs kubernetes.Interface, node string) func() error {
		return func() error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"status":{"phase":"x"}}`), metav1.PatchOptions{DryRun: dry}, "status")
			return err
		}
	}
	checks := []struct {
		name  string
		do    func() error
		allow bool
		// who and node the denial names, and a reason it must give.
		who, node, reason string
	}{
		{name: "own region: delete", do: del(eu, "dom-eu"), allow: true},
		{name: "own region: taint", do: taint(eu, "dom-eu"), allow: true},
		{name: "other region: delete", do: del(eu, "dom-us"), who: "NativeCCM d-eu", node: "dom-us", reason: regionLabel + "=us-east-1"},
		{name: "other region: taint", do: taint(eu, "dom-us"), who: "NativeCCM d-eu", node: "dom-us", reason: "outside the domain of NativeCCM d-eu"},
		{name: "other region: status", do: status(eu, "dom-us"), who: "NativeCCM d-eu", node: "dom-us"},
		{name: "no region label: delete", do: del(eu, "dom-noregion"), who: "NativeCCM d-eu", node: "dom-noregion", reason: regionLabel + "=(none)"},
		{name: "the other region's CCM: delete its own", do: del(us, "dom-us"), allow: true},
		{name: "the other region's CCM: not the first region's", do: del(us, "dom-eu"), who: "NativeCCM d-us", node: "dom-eu", reason: regionLabel + "=eu-west-1"},
		{name: "a NativeCCM without a domain keeps the whole platform", do: del(all, "dom-us"), allow: true},
		{name: "a NativeCCM without a domain, node without region", do: del(all, "dom-noregion"), allow: true},
		{name: "a domain never reaches another platform", do: del(eu, "dom-hc-p1"), who: "NativeCCM d-eu", node: "dom-hc-p1"},

		{name: "split member: own value", do: del(splitEU, "dom-eu"), allow: true},
		{name: "split member: own value, taint", do: taint(splitEU, "dom-eu-2"), allow: true},
		{name: "split member: other value", do: del(splitEU, "dom-us"), who: "NativeCCM d-split--eu-west-1", node: "dom-us", reason: "for the value eu-west-1 of the split label; the node's domain labels are " + v1.DomainLabel + "=(none), " + regionLabel + "=us-east-1"},
		{name: "split member: no value", do: del(splitEU, "dom-noregion"), who: "NativeCCM d-split--eu-west-1", node: "dom-noregion", reason: regionLabel + "=(none)"},
		{name: "split member: a look-alike value", do: del(splitEU, "dom-lookalike"), who: "NativeCCM d-split--eu-west-1", node: "dom-lookalike", reason: regionLabel + "=EU_West.1"},
		{name: "the other split member", do: del(splitUS, "dom-us"), allow: true},
		{name: "the other split member, not the first's node", do: status(splitUS, "dom-eu"), who: "NativeCCM d-split--us-east-1", node: "dom-eu"},
		{name: "a member of a NativeCCM that does not split", do: del(notSplit, "dom-us"), who: "NativeCCM d-eu--us-east-1", reason: "names no split label"},
		{name: "a member of a NativeCCM that does not split, in its parent's domain", do: del(notSplit, "dom-eu"), who: "NativeCCM d-eu--us-east-1", reason: "names no split label"},

		{name: "domain label: own project", do: del(p1, "dom-hc-p1"), allow: true},
		{name: "domain label: other project", do: del(p1, "dom-hc-p2"), who: "NativeCCM d-p1", node: "dom-hc-p2", reason: v1.DomainLabel + "=p2"},
	}
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			checkFenceDecision(t, tc.do(), tc.allow, tc.who, tc.node, tc.reason)
		})
	}

	t.Run("a split member serves no Services", func(t *testing.T) {
		if err := gatetest.GrantLoadBalancers(ctx, admin, ns, "native-ccm-d-split--eu-west-1"); err != nil {
			t.Fatal(err)
		}
		err := splitEU.CoreV1().RESTClient().Patch(types.MergePatchType).Namespace("default").Resource("services").Name("kubernetes").SubResource("status").
			Param("dryRun", "All").Body([]byte(`{"status":{}}`)).Do(ctx).Error()
		checkFenceDecision(t, err, false, "NativeCCM d-split--eu-west-1", "default/kubernetes", "serves no load balancers")
	})

	t.Run("a node relabelled into another domain is refused to its old owner at once", func(t *testing.T) {
		if _, err := admin.CoreV1().Nodes().Patch(ctx, "dom-eu-2", types.MergePatchType, []byte(`{"metadata":{"labels":{"`+regionLabel+`":"us-east-1"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		checkFenceDecision(t, del(eu, "dom-eu-2")(), false, "NativeCCM d-eu", "dom-eu-2", regionLabel+"=us-east-1")
		checkFenceDecision(t, del(splitEU, "dom-eu-2")(), false, "NativeCCM d-split--eu-west-1", "dom-eu-2", regionLabel+"=us-east-1")
		checkFenceDecision(t, del(us, "dom-eu-2")(), true)
		checkFenceDecision(t, del(splitUS, "dom-eu-2")(), true)
	})

	t.Run("a domain withdrawn from the grant takes effect", func(t *testing.T) {
		g := gate.Grant{NativeCCM: "d-us", Namespace: ns, Platform: "aws", Domain: region("ap-south-1")}
		if err := gate.EnsureGrant(ctx, c, g); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			err := del(us, "dom-us")()
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "outside the domain of NativeCCM d-us"), nil
		})
		if err != nil {
			t.Fatalf("d-us kept us-east-1 after its grant moved to ap-south-1: %v", err)
		}
	})

	t.Run("CheckGrant names a missing domain rule", func(t *testing.T) {
		err := gate.CheckGrant(ctx, c, gate.Grant{NativeCCM: "d-eu", Namespace: ns, Platform: "aws", Domain: region("eu-west-1", "eu-central-1")})
		var ge *gate.GrantError
		if !errors.As(err, &ge) || !strings.Contains(err.Error(), "domain "+regionLabel+"=eu-central-1") {
			t.Fatalf("got %v, want a GrantError naming domain %s=eu-central-1", err, regionLabel)
		}
		if err := gate.CheckGrant(ctx, c, gate.Grant{NativeCCM: "d-eu", Namespace: ns, Platform: "aws", Domain: region("eu-west-1")}); err != nil {
			t.Fatalf("the grant as made: %v", err)
		}
		err = gate.CheckGrant(ctx, c, gate.Grant{NativeCCM: "d-eu", Namespace: ns, Platform: "aws", Domain: gate.DomainGrant{SplitBy: regionLabel}})
		if !errors.As(err, &ge) || !strings.Contains(err.Error(), "the split by "+regionLabel) {
			t.Fatalf("got %v, want a GrantError naming the split", err)
		}
	})

	t.Run("the installed fence says which labels it checks", func(t *testing.T) {
		installed, err := gate.ReadFence(ctx, c, fence)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(installed.DomainKeys, ","); got != v1.DomainLabel+","+regionLabel {
			t.Fatalf("domain keys %s", got)
		}
	})
}

func TestDomainKeyLiteral(t *testing.T) {
	if got, err := gate.DomainKeyLiteral([]string{regionLabel, v1.DomainLabel, regionLabel}); err != nil || got != `["`+v1.DomainLabel+`","`+regionLabel+`"]` {
		t.Fatalf("got %s %v", got, err)
	}
	for _, keys := range [][]string{{"a", "b", "c", "d", "e"}, {"not a key"}} {
		if _, err := gate.DomainKeyLiteral(keys); !errors.Is(err, gate.ErrConfig) {
			t.Errorf("%v: got %v, want ErrConfig", keys, err)
		}
	}
}

// TestFenceSplitMembersWithTokens: the members of a NativeCCM split by
// region, authenticated as pods are (bound ServiceAccount tokens from the
// TokenRequest API), under the grant GrantFor makes of its spec
// (spec.domain.splitBy: the grant names the split): each member may delete
// the nodes of its own region and is Forbidden the other region's; with
// the split taken out of the grant, a member may change nothing.
func TestFenceSplitMembersWithTokens(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := e.Client
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "kube-system"
	nodes := []gatetest.NodeSpec{
		{Name: "tok-eu", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0t1", Labels: map[string]string{regionLabel: "eu-west-1"}},
		{Name: "tok-us", Platform: "aws", ProviderID: "aws:///us-east-1a/i-0t2", Labels: map[string]string{regionLabel: "us-east-1"}},
	}
	if err := gatetest.CreateNodes(ctx, admin, nodes...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			_ = admin.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{})
		}
	})
	fence := gate.Fence{Namespace: ns}
	if _, err := gate.EnsureFence(ctx, c, fence); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteFence(context.Background(), c, fence) })

	split := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "tok-split"}, Spec: v1.NativeCCMSpec{Platform: "aws", Domain: &v1.Domain{SplitBy: regionLabel}}}
	g := gate.GrantFor(split, ns)
	if g.Domain.SplitBy != regionLabel {
		t.Fatalf("GrantFor(spec.domain.splitBy %s) = %+v, want the split in the grant", regionLabel, g.Domain)
	}
	if err := gate.EnsureGrant(ctx, c, g); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gate.DeleteGrant(context.Background(), c, split.Name) })

	member := func(value string) kubernetes.Interface {
		t.Helper()
		sa := split.MemberReleaseName(value)
		if err := gatetest.GrantNativeCCM(ctx, admin, ns, sa); err != nil {
			t.Fatal(err)
		}
		token, err := gatetest.ServiceAccountToken(ctx, admin, ns, sa)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = admin.CoreV1().ServiceAccounts(ns).Delete(context.Background(), sa, metav1.DeleteOptions{})
		})
		return kubernetes.NewForConfigOrDie(&rest.Config{Host: e.Config.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: e.Config.CAData}})
	}
	eu, us := member("eu-west-1"), member("us-east-1")
	if err := gatetest.WaitFence(ctx, eu, "tok-us", true); err != nil {
		t.Fatalf("fence never became active: %v", err)
	}
	del := func(cs kubernetes.Interface, node string) error {
		return cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}
	if err := gatetest.WaitFenceAllows(ctx, func() error { return del(eu, "tok-eu") }); err != nil {
		t.Fatalf("the fence of this test never came into effect: %v", err)
	}
	for _, tc := range []struct {
		name  string
		cs    kubernetes.Interface
		node  string
		allow bool
		// who the denial names, and the node's label it gives
		who, label string
	}{
		{name: "eu-west-1 member: its own node", cs: eu, node: "tok-eu", allow: true},
		{name: "eu-west-1 member: us-east-1's node", cs: eu, node: "tok-us", who: "NativeCCM tok-split--eu-west-1", label: regionLabel + "=us-east-1"},
		{name: "us-east-1 member: its own node", cs: us, node: "tok-us", allow: true},
		{name: "us-east-1 member: eu-west-1's node", cs: us, node: "tok-eu", who: "NativeCCM tok-split--us-east-1", label: regionLabel + "=eu-west-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.allow {
				checkFenceDecision(t, del(tc.cs, tc.node), true)
				return
			}
			checkFenceDecision(t, del(tc.cs, tc.node), false, tc.who, tc.node, tc.label)
		})
	}

	t.Run("without the split in the grant a member may change nothing", func(t *testing.T) {
		if err := gate.EnsureGrant(ctx, c, gate.Grant{NativeCCM: split.Name, Namespace: ns, Platform: "aws"}); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			err := del(eu, "tok-eu")
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "names no split label"), nil
		})
		if err != nil {
			t.Fatalf("a member kept its own node after the split left the grant: %v", del(eu, "tok-eu"))
		}
	})
}
