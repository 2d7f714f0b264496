package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	"helm.sh/helm/v3/pkg/action"
	helmrelease "helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
)

// TestTakeOverFailedUpgradeNotRolledBack: a NativeCCM with spec.takeOver
// is installed; the previous CCM runs again, and while an upgrade of the
// native release waits for its pods, a person removes the release (helm
// uninstall --keep-history): the upgrade fails. The coordinator rolled a
// failed upgrade back at once, and the rollback put the CCM's objects back
// beside the previous CCM, with no look at its Lease. Now a failed upgrade
// is not rolled back while the previous CCM runs (a Warning event says
// why); the release comes back once it stops. split: the same for a member
// of a split NativeCCM.
func TestTakeOverFailedUpgradeNotRolledBack(t *testing.T) {
	const durationS = 3
	for _, c := range []struct {
		name, node, providerID, region string
	}{
		{name: "takeover-norollback", node: "tnr-1", providerID: "hcloud://9431"},
		{name: "takeover-split-norollback", node: "tsnr-1", providerID: "aws:///eu-west-1a/i-0c31", region: "eu-west-1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			name, rel, leaseName := c.name, "native-ccm-"+c.name, c.name+"-previous-ccm"
			if c.region == "" {
				hcloudTakeOver(t, name, c.node, c.providerID, "kube-system/"+leaseName)
			} else {
				rel += "--" + c.region
				awsSplitSecret(t, name+"-credentials")
				createRegionNode(t, c.node, name, c.region, c.providerID)
				createNativeCCM(t, splitTakeOver(name, name+"-credentials", "kube-system/"+leaseName))
			}
			waitDeployment(t, "installed", rel)

			previous := previousLeads(t, leaseName, "cloud-controller-manager-d9t6_3c4d", durationS)
			engine.duringUpgrade.Store(rel, func() {
				if err := uninstallKeepHistory(rel); err != nil {
					t.Error(err)
				}
			})
			t.Cleanup(func() { engine.duringUpgrade.Delete(rel) })
			updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Overrides = &v1.Overrides{Args: []string{"--v=4"}} })
			eventually(t, "the upgrade tried (its by-hand uninstall done)", func() (bool, string) {
				_, waiting := engine.duringUpgrade.Load(rel)
				return !waiting, "no upgrade yet"
			})
			neverDeployment(t, "the failed upgrade rolled back beside the previous CCM", 3*durationS*time.Second, name, rel)
			if ok, msg := poll(20*time.Second, func() (bool, string) { return warningWith(t, name, v1.WaitingForPreviousCCMReason, "not rolled back") }); !ok {
				t.Errorf("no Warning event saying the failed upgrade of %s was not rolled back: %s", rel, msg)
			}
			previous.stop()
			waitDeployment(t, "installed again once the previous CCM stopped", rel)
		})
	}
}

// TestTakeOverUpgradeOfFailedWaits: the latest revision of a NativeCCM's
// release is failed, its objects gone (an upgrade failed while a person
// removed the release: Helm writes failed over the uninstalled revision),
// and the one before superseded, while the previous CCM runs again. The
// coordinator upgraded such a release with no look at the previous CCM's
// Lease, and Helm's upgrade of a failed release created the CCM again
// beside it. Now that upgrade waits for the previous CCM, as an install
// does.
func TestTakeOverUpgradeOfFailedWaits(t *testing.T) {
	const (
		name      = "takeover-upgradefailed"
		rel       = "native-ccm-" + name
		leaseName = name + "-previous-ccm"
		durationS = 3
	)
	hcloudTakeOver(t, name, "tuf-1", "hcloud://9441", "kube-system/"+leaseName)
	waitCondition(t, name, v1.InstalledCondition, metav1.ConditionTrue, "")
	upgradeOnce(t, name)

	previous := previousLeads(t, leaseName, "hcloud-cloud-controller-manager-e1u7_5e6f", durationS)
	if err := uninstallKeepHistory(rel); err != nil {
		t.Fatal(err)
	}
	cfg, err := helmConfig()
	if err != nil {
		t.Fatal(err)
	}
	last, err := cfg.Releases.Last(rel)
	if err != nil {
		t.Fatal(err)
	}
	last.Info.Status = helmrelease.StatusFailed
	if err := cfg.Releases.Update(last); err != nil {
		t.Fatal(err)
	}
	requestReconcile(t, name)
	neverDeployment(t, "the failed release upgraded beside the previous CCM", 3*durationS*time.Second, name, rel)
	if o := getNativeCCM(t, name); !conditions.HasAnyReason(o, meta.ReadyCondition, v1.WaitingForPreviousCCMReason) {
		t.Errorf("Ready %q: %s, want %s", conditions.GetReason(o, meta.ReadyCondition), conditions.GetMessage(o, meta.ReadyCondition), v1.WaitingForPreviousCCMReason)
	}
	previous.stop()
	waitDeployment(t, "upgraded once the previous CCM stopped", rel)
}

// helmConfig is Helm's action configuration on the releases' namespace, as
// the helm CLI of a person sets it up.
func helmConfig() (*action.Configuration, error) {
	cfg := new(action.Configuration)
	err := cfg.Init(helm.ClusterAccess(env.Config, releaseNamespace), releaseNamespace, "secret", func(string, ...any) {})
	return cfg, err
}

// uninstallKeepHistory uninstalls release as a person would with helm
// uninstall --keep-history (its objects gone, its records kept).
func uninstallKeepHistory(release string) error {
	cfg, err := helmConfig()
	if err != nil {
		return err
	}
	un := action.NewUninstall(cfg)
	un.KeepHistory = true
	_, err = un.Run(release)
	return err
}

// warningWith reports whether object has a Warning event with reason whose
// message contains substr.
func warningWith(t *testing.T, object, reason, substr string) (bool, string) {
	t.Helper()
	var seen []string
	for _, e := range eventsOf(t, object) {
		if e.Type == corev1.EventTypeWarning && e.Reason == reason && strings.Contains(e.Message, substr) {
			return true, ""
		}
		seen = append(seen, e.Reason+": "+e.Message)
	}
	return false, fmt.Sprintf("events of %s: %q", object, seen)
}
