package controller

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const regionLabel = "topology.kubernetes.io/region"

func createRegionNode(t *testing.T, name, platform, region, providerID string) {
	t.Helper()
	labels := map[string]string{names.PlatformLabel: platform}
	if region != "" {
		labels[regionLabel] = region
	}
	create(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{ProviderID: providerID}})
}

func regionDomain(regions ...string) *v1.Domain {
	return &v1.Domain{Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: regionLabel, Operator: metav1.LabelSelectorOpIn, Values: regions},
	}}}
}

// waitMessage waits for the condition with reason and a message holding
// every one of want.
func waitMessage(t *testing.T, name, ctype string, status metav1.ConditionStatus, reason string, want ...string) *v1.NativeCCM {
	t.Helper()
	var obj *v1.NativeCCM
	eventually(t, fmt.Sprintf("%s %s=%s (%s) saying %q", name, ctype, status, reason, want), func() (bool, string) {
		obj = getNativeCCM(t, name)
		c := conditions.Get(obj, ctype)
		if c == nil || c.Status != status || c.Reason != reason {
			return false, fmt.Sprintf("%+v", c)
		}
		for _, w := range want {
			if !strings.Contains(c.Message, w) {
				return false, c.Message
			}
		}
		return true, ""
	})
	return obj
}

func noDeployment(t *testing.T, release string) {
	t.Helper()
	if _, err := getDeployment(t, release); !apierrors.IsNotFound(err) {
		t.Fatalf("release %s has a Deployment (%v), want none", release, err)
	}
}

// TestDomains: a platform whose profile knows its boundary (the region) and
// nodes in two regions. A NativeCCM for the whole platform is refused with
// the regions named; one per region is installed with its view narrowed to
// its region; a domain overlapping an older one's is refused naming both and
// a node; nodes no domain covers are reported until a domain covers them.
func TestDomains(t *testing.T) {
	const platform = "domain-a"
	hcloudSecret(t)
	createRegionNode(t, "dom-eu-1", platform, "eu-west-1", "hcloud://7101")
	createRegionNode(t, "dom-eu-2", platform, "eu-west-1", "hcloud://7102")
	createRegionNode(t, "dom-us-1", platform, "us-east-1", "hcloud://7201")

	// One NativeCCM for the platform: its nodes span two regions.
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "domain-a"}, Spec: v1.NativeCCMSpec{Platform: platform}})
	obj := waitMessage(t, "domain-a", meta.StalledCondition, metav1.ConditionTrue, v1.DomainSpansBoundaryReason,
		"2 values of "+regionLabel, "eu-west-1 (2 node(s), e.g. dom-eu-1)", "us-east-1 (1 node(s), e.g. dom-us-1)", "spec.domain.selector")
	if conditions.IsReady(obj) || obj.Status.Release != nil {
		t.Fatalf("a spanning NativeCCM is ready or installed: %+v", obj.Status)
	}
	noDeployment(t, "native-ccm-domain-a")
	if ok, seen := hasEvent(t, "domain-a", v1.DomainSpansBoundaryReason); !ok {
		t.Fatalf("no %s event: %s", v1.DomainSpansBoundaryReason, seen)
	}

	// A region's NativeCCM, younger, overlaps it.
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "domain-a-eu"}, Spec: v1.NativeCCMSpec{Platform: platform, Profile: platform, Domain: regionDomain("eu-west-1")}})
	waitMessage(t, "domain-a-eu", meta.StalledCondition, metav1.ConditionTrue, v1.DomainOverlapReason,
		"NativeCCM domain-a (older)", regionLabel+"=eu-west-1", "e.g. node dom-eu-1")
	noDeployment(t, "native-ccm-domain-a-eu")

	// The platform-wide one goes: the region's is installed, gated to its region.
	if err := k8s.Delete(ctxT(t), &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "domain-a"}}); err != nil {
		t.Fatal(err)
	}
	obj = waitCondition(t, "domain-a-eu", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if obj.Status.Nodes != 2 {
		t.Errorf("status.nodes %d, want the 2 nodes of its region", obj.Status.Nodes)
	}
	if msg := conditions.GetMessage(obj, v1.GatedCondition); !strings.Contains(msg, regionLabel+" in (eu-west-1)") {
		t.Errorf("Gated does not name the domain: %s", msg)
	}
	d, err := getDeployment(t, "native-ccm-domain-a-eu")
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(gateArgs(d), " "); !strings.Contains(args, "--domain-selector="+regionLabel+" in (eu-west-1)") {
		t.Errorf("ccm-gate args %s, want the domain selector", args)
	}
	// us-east-1 is nobody's.
	obj = waitMessage(t, "domain-a-eu", v1.NodesOwnedCondition, metav1.ConditionFalse, v1.UnownedNodesReason, "1 node(s) of platform "+platform, "dom-us-1")
	if obj.Status.UnownedNodes != 1 {
		t.Errorf("status.unownedNodes %d, want 1", obj.Status.UnownedNodes)
	}
	if ok, seen := hasEvent(t, "domain-a-eu", v1.UnownedNodesReason); !ok {
		t.Fatalf("no %s event: %s", v1.UnownedNodesReason, seen)
	}

	// The second region's NativeCCM: both installed, every node owned.
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "domain-a-us"}, Spec: v1.NativeCCMSpec{Platform: platform, Profile: platform, Domain: regionDomain("us-east-1")}})
	obj = waitCondition(t, "domain-a-us", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if obj.Status.Nodes != 1 {
		t.Errorf("domain-a-us: status.nodes %d, want 1", obj.Status.Nodes)
	}
	waitCondition(t, "domain-a-eu", v1.NodesOwnedCondition, metav1.ConditionTrue, v1.AllNodesOwnedReason)
	waitCondition(t, "domain-a-us", v1.NodesOwnedCondition, metav1.ConditionTrue, v1.AllNodesOwnedReason)
}

// TestInvalidDomains: domains the fence or the coordinator cannot enforce
// stall with the field named, and install nothing.
func TestInvalidDomains(t *testing.T) {
	const platform = "domain-b"
	hcloudSecret(t)
	createRegionNode(t, "domb-1", platform, "eu-west-1", "hcloud://7301")
	for _, tc := range []struct {
		name   string
		domain *v1.Domain
		want   []string
	}{
		{"domain-b-key", &v1.Domain{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"example.com/project": "p1"}}},
			[]string{"spec.domain.selector", "not [example.com/project]", "fence.domainLabels"}},
		{"domain-b-platform", &v1.Domain{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{names.PlatformLabel: "other"}}},
			[]string{"spec.domain.selector", "spec.platform's label"}},
		{"domain-b-empty", &v1.Domain{Selector: &metav1.LabelSelector{
			MatchLabels:      map[string]string{regionLabel: "a"},
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: regionLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{"b"}}},
		}}, []string{"no value in common"}},
		{"domain-b--x", nil, []string{`metadata.name "domain-b--x" contains "--"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: tc.name}, Spec: v1.NativeCCMSpec{Platform: platform, Profile: platform, Domain: tc.domain}})
			waitMessage(t, tc.name, meta.StalledCondition, metav1.ConditionTrue, v1.InvalidDomainReason, tc.want...)
			noDeployment(t, "native-ccm-"+tc.name)
		})
	}
}

// gateArgs are the ccm-gate sidecar's args of a release's Deployment.
func gateArgs(d *appsv1.Deployment) []string {
	for _, c := range d.Spec.Template.Spec.InitContainers {
		if c.Name == gate.SidecarName {
			return c.Args
		}
	}
	return nil
}

// TestInstalledCCMKeptToItsRegion: a NativeCCM without a domain runs while
// its nodes are in one region; when a node of another region appears (or a
// kubelet sets another region on its own Node), the installed CCM is not
// taken away but kept to its region: its view narrowed, the other region's
// node named as no native CCM's.
func TestInstalledCCMKeptToItsRegion(t *testing.T) {
	const platform = "domain-c"
	hcloudSecret(t)
	createRegionNode(t, "domc-eu-1", platform, "eu-west-1", "hcloud://7401")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: platform}, Spec: v1.NativeCCMSpec{Platform: platform}})
	obj := waitCondition(t, platform, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	eventually(t, "the region recorded", func() (bool, string) {
		obj = getNativeCCM(t, platform)
		return obj.Status.BoundaryValue == "eu-west-1", fmt.Sprintf("status.boundaryValue %q", obj.Status.BoundaryValue)
	})
	revision := obj.Status.Release.Revision
	d, err := getDeployment(t, "native-ccm-"+platform)
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(gateArgs(d), " "); strings.Contains(args, "--domain-selector") {
		t.Fatalf("a NativeCCM without a domain in one region got a domain selector: %s", args)
	}

	createRegionNode(t, "domc-us-1", platform, "us-east-1", "hcloud://7402")
	waitMessage(t, platform, v1.NodesOwnedCondition, metav1.ConditionFalse, v1.DomainSpansBoundaryReason,
		"kept to "+regionLabel+"=eu-west-1", "us-east-1 (1 node(s), e.g. domc-us-1)")
	eventually(t, "the view narrowed to eu-west-1", func() (bool, string) {
		d, err := getDeployment(t, "native-ccm-"+platform)
		if err != nil {
			return false, err.Error()
		}
		args := strings.Join(gateArgs(d), " ")
		return strings.Contains(args, "--domain-selector="+regionLabel+" in (eu-west-1)"), args
	})
	eventually(t, "the same release upgraded, one node in its view", func() (bool, string) {
		obj = getNativeCCM(t, platform)
		return obj.Status.Release != nil && obj.Status.Release.Revision > revision && obj.Status.Nodes == 1 && conditions.IsReady(obj),
			fmt.Sprintf("release %+v, nodes %d, ready %v", obj.Status.Release, obj.Status.Nodes, conditions.IsReady(obj))
	})
	if ok, seen := hasEvent(t, platform, v1.DomainSpansBoundaryReason); !ok {
		t.Fatalf("no %s event: %s", v1.DomainSpansBoundaryReason, seen)
	}
}
