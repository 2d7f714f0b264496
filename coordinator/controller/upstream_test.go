package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// apiServer is the test API server's version and minor, as discovery says.
func apiServer(t *testing.T) (string, int) {
	t.Helper()
	info, err := discovery.NewDiscoveryClientForConfigOrDie(env.Config).ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	minor, err := profile.ServerMinor(info.GitVersion)
	if err != nil {
		t.Fatal(err)
	}
	return info.GitVersion, minor
}

// TestUpstreamForTheAPIServerMinor: the coordinator runs the Azure profile's
// release for the API server's minor, says so on the NativeCCM (status,
// ProfileResolved, an event) and, as that release filters nodes itself,
// passes --node-filter-requirements with the NativeCCM's platform. An
// overridden older tag without the flag wins, is reported as the override
// and gets no filter flag (the CCM would exit on an unknown flag).
func TestUpstreamForTheAPIServerMinor(t *testing.T) {
	const name, rel = "azure-a", "native-ccm-azure-a"
	const filter = "--node-filter-requirements=node.cloudprovider.kubernetes.io/platform=azure-a"
	git, minor := apiServer(t)
	createSecret(t, "azure-cloud-config", map[string]string{"azure.json": "{}"})
	createNode(t, "aza-1", name, "azure:///subscriptions/s/resourcegroups/rg/providers/Microsoft.Compute/virtualMachines/aza-1")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{Platform: name}})

	// what profiles/azure.yaml names for this minor (1.34-1.36 all have the flag);
	// it names no 1.37 release, so on 1.37 the 1.36 one runs, one minor of skew
	tags := map[int]string{34: "v1.34.13", 35: "v1.35.8", 36: "v1.36.5", 37: "v1.36.5"}
	tag, ok := tags[minor]
	if !ok {
		t.Fatalf("the test knows Azure's releases for 1.34-1.37, not for the API server %s", git)
	}
	skew := minor - min(minor, 36)
	minor -= skew // the minor the release is for
	want := "mcr.microsoft.com/oss/kubernetes/azure-cloud-controller-manager:" + tag
	obj := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	u := obj.Status.Upstream
	if u == nil || u.Image != want || u.Source != "Profile" || u.KubernetesMinor != profile.MinorString(minor) ||
		u.APIServerVersion != git || u.Skew == nil || *u.Skew != int32(skew) || u.NodeFilter == nil || !slices.Equal(u.NodeFilter.Args, []string{filter}) {
		t.Fatalf("status.upstream = %+v, want %s from the profile for %s (API server %s), skew %d, filter %s", u, want, profile.MinorString(minor), git, skew, filter)
	}
	which := "(the profile's release for Kubernetes " + profile.MinorString(minor) + ")"
	if skew > 0 {
		which = "(the profile has none for Kubernetes " + profile.MinorString(minor+skew) + ": its release for " + profile.MinorString(minor) + ")"
	}
	if c := conditions.Get(obj, v1.ProfileResolvedCondition); c == nil || !strings.Contains(c.Message, "upstream CCM "+want+" "+which+" for API server "+git) {
		t.Errorf("ProfileResolved = %+v", c)
	}
	c := ccmContainer(t, rel)
	if c.Image != want || !slices.Contains(c.Args, filter) {
		t.Errorf("CCM container image %s args %q, want %s with %s", c.Image, c.Args, want, filter)
	}
	if ok, state := hasEvent(t, name, v1.UpstreamChosenReason); !ok {
		t.Error(state)
	}

	// v1.33.2 predates the filter's backport (v1.33.3).
	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Overrides = &v1.Overrides{Image: &v1.Image{Tag: "v1.33.2"}} })
	obj = waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.UpgradeSucceededReason)
	u = obj.Status.Upstream
	if u == nil || !strings.HasSuffix(u.Image, ":v1.33.2") || u.Source != "Override" || u.Skew != nil || u.KubernetesMinor != "" || u.NodeFilter != nil {
		t.Errorf("status.upstream with an overridden tag = %+v", u)
	}
	c = ccmContainer(t, rel)
	if !strings.HasSuffix(c.Image, ":v1.33.2") || slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--node-filter-requirements") }) {
		t.Errorf("CCM container image %s args %q: want v1.33.2 without the filter flag", c.Image, c.Args)
	}
}

// TestNoUpstreamForTheAPIServer: a profile whose only release is two minors
// older than the API server installs nothing (Stalled, a readable
// ProfileResolved, a Warning event); an overridden image wins, is installed,
// and its skew is reported.
func TestNoUpstreamForTheAPIServer(t *testing.T) {
	const name, rel = "skew-a", "native-ccm-skew-a"
	git, minor := apiServer(t)
	createSecret(t, "azure-cloud-config", map[string]string{"azure.json": "{}"})
	createNode(t, "skew-1", name, "azure:///subscriptions/s/resourcegroups/rg/providers/Microsoft.Compute/virtualMachines/skew-1")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{Platform: name}})

	obj := waitCondition(t, name, meta.StalledCondition, metav1.ConditionTrue, v1.NoUpstreamForKubernetesVersionReason)
	wantMsg := fmt.Sprintf("profile skew-a has no upstream CCM release for Kubernetes %s or %s (ccm.image.tags has %s): a CCM may be at most one minor older than the API server",
		profile.MinorString(minor), profile.MinorString(minor-1), profile.MinorString(minor-2))
	if c := conditions.Get(obj, v1.ProfileResolvedCondition); c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, wantMsg) {
		t.Errorf("ProfileResolved = %+v, want False saying %q", c, wantMsg)
	}
	if !conditions.IsFalse(obj, meta.ReadyCondition) || obj.Status.Release != nil {
		t.Errorf("status = %+v", obj.Status)
	}
	if _, err := getDeployment(t, rel); !apierrors.IsNotFound(err) {
		t.Errorf("a release without an upstream CCM for the API server: %v", err)
	}
	if ok, state := hasEvent(t, name, v1.NoUpstreamForKubernetesVersionReason); !ok {
		t.Error(state)
	}

	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Overrides = &v1.Overrides{Image: &v1.Image{Tag: "v1.0.0-old"}} })
	obj = waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	u := obj.Status.Upstream
	if u == nil || u.Source != "Override" || u.KubernetesMinor != profile.MinorString(minor-2) || u.Skew == nil || *u.Skew != 2 || u.APIServerVersion != git {
		t.Errorf("status.upstream = %+v, want the override, for %s, skew 2", u, profile.MinorString(minor-2))
	}
	if conditions.Has(obj, meta.StalledCondition) {
		t.Errorf("still stalled: %+v", obj.Status.Conditions)
	}
	eventually(t, "a Warning UpstreamChosen event", func() (bool, string) {
		var list corev1.EventList
		if err := k8s.List(ctxT(t), &list, client.MatchingFields{"involvedObject.name": name}); err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Reason == v1.UpstreamChosenReason && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "2 minors older than the API server") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(list.Items))
	})
}
