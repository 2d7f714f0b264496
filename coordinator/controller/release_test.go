package controller

import (
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
)

// TestNextAction: the release action follows from whether the release is
// wanted and the state of its latest revision.
func TestNextAction(t *testing.T) {
	const digest = "d1"
	for _, tc := range []struct {
		name string
		// want: the install policy wants the release.
		want bool
		// info is the latest revision; nil: no release.
		info *release.Info
		// action is what the release step does.
		action releaseAction
	}{
		{name: "wanted, none", want: true, action: actionInstall},
		{name: "wanted, deployed as desired", want: true,
			info: &release.Info{Revision: 2, Status: release.StatusDeployed, Digest: digest, LastDeployed: 2}, action: actionNone},
		{name: "wanted, deployed from another spec", want: true,
			info: &release.Info{Revision: 2, Status: release.StatusDeployed, Digest: "d0", LastDeployed: 2}, action: actionUpgrade},
		{name: "wanted, failed upgrade of a deployed release", want: true,
			info: &release.Info{Revision: 3, Status: "failed", Digest: digest, LastDeployed: 2}, action: actionUpgrade},
		{name: "wanted, failed first install", want: true,
			info: &release.Info{Revision: 1, Status: "failed", Digest: digest}, action: actionReinstall},
		{name: "wanted, uninstalled by hand keeping its history, after an upgrade", want: true,
			info: &release.Info{Revision: 3, Status: release.StatusUninstalled, Digest: digest, LastDeployed: 2}, action: actionReinstall},
		{name: "wanted, being uninstalled by hand", want: true,
			info: &release.Info{Revision: 2, Status: release.StatusUninstalling, Digest: digest, LastDeployed: 1}, action: actionReinstall},
		{name: "not wanted, there", info: &release.Info{Revision: 1, Status: release.StatusDeployed, LastDeployed: 1}, action: actionUninstall},
		{name: "not wanted, failed first install", info: &release.Info{Revision: 1, Status: "failed"}, action: actionUninstall},
		{name: "not wanted, none", action: actionNone},
	} {
		if got := nextAction(tc.want, tc.info, digest); got != tc.action {
			t.Errorf("%s: action %d, want %d", tc.name, got, tc.action)
		}
	}
}

// TestReleaseAlreadyThereIsAdopted: the release exists while the NativeCCM's
// status knows nothing of it (as after a status write that was lost). The
// reconciler, assuming no release, tries to install, finds the name in use,
// and takes that for what it is: not a failure, but a release to read and
// bring up to date (here: upgraded with the gate the first install lacked).
func TestReleaseAlreadyThereIsAdopted(t *testing.T) {
	const name, rel = "adopt-a", "native-ccm-adopt-a"
	hcloudSecret(t)
	p, ok := profiles.Get(name)
	if !ok {
		t.Fatalf("no profile %s", name)
	}
	req, err := release.FromProfile(p, release.Instance{ReleaseName: rel, Namespace: releaseNamespace, Platform: name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := helm.NewEngine(env.Config, helm.Options{Timeout: time.Minute}).Install(ctxT(t), req); err != nil {
		t.Fatal(err)
	}

	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NativeCCMSpec{Platform: name, Install: v1.InstallAlways},
	})
	obj := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.UpgradeSucceededReason)
	if obj.Status.Failures != 0 || obj.Status.Release == nil || obj.Status.Release.Revision != 2 {
		t.Fatalf("status %+v: want revision 2 and no failure", obj.Status)
	}
	if failed, _ := eventNow(t, name, v1.InstallFailedReason); failed {
		t.Error("the release already there was reported as a failed install")
	}
}

// TestGateOnlyForAWantedRelease: the gate step runs only for a release that
// is wanted: a NativeCCM whose release is not (install policy Never) gets no
// Gated condition and no status.gate; once it is wanted, the gate is in place
// before the release is installed; when it is no longer wanted, the release
// goes and Gated with it (as Healthy does).
func TestGateOnlyForAWantedRelease(t *testing.T) {
	const name = "gate-wanted-a"
	hcloudSecret(t)
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NativeCCMSpec{Platform: name, Install: v1.InstallNever},
	})
	obj := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallDisabledReason)
	if c := conditions.Get(obj, v1.GatedCondition); c != nil || obj.Status.Gate != nil {
		t.Fatalf("gate looked at for a release that is not wanted: Gated %+v, status.gate %+v", c, obj.Status.Gate)
	}

	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Install = v1.InstallAlways })
	obj = waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	if !conditions.IsTrue(obj, v1.GatedCondition) || obj.Status.Gate == nil {
		t.Fatalf("installed without the gate: Gated %+v, status.gate %+v", conditions.Get(obj, v1.GatedCondition), obj.Status.Gate)
	}

	updateNativeCCM(t, name, func(o *v1.NativeCCM) { o.Spec.Install = v1.InstallNever })
	obj = waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, v1.InstallDisabledReason)
	if c := conditions.Get(obj, v1.GatedCondition); c != nil {
		t.Errorf("Gated kept without a release: %+v", c)
	}
	if _, err := getDeployment(t, "native-ccm-"+name); !apierrors.IsNotFound(err) {
		t.Errorf("release Deployment still there: %v", err)
	}
}
