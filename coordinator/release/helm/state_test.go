package helm

import (
	"context"
	"testing"

	helmrelease "helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// TestStatusNamesAreHelms: coordinator/release names release statuses without
// importing Helm; for every status Helm has, Info says deployed and pending
// exactly when Helm does.
func TestStatusNamesAreHelms(t *testing.T) {
	for _, s := range []helmrelease.Status{
		helmrelease.StatusUnknown, helmrelease.StatusDeployed, helmrelease.StatusUninstalled,
		helmrelease.StatusSuperseded, helmrelease.StatusFailed, helmrelease.StatusUninstalling,
		helmrelease.StatusPendingInstall, helmrelease.StatusPendingUpgrade, helmrelease.StatusPendingRollback,
	} {
		info := &release.Info{Status: s.String()}
		if info.Deployed() != (s == helmrelease.StatusDeployed) {
			t.Errorf("%s: Deployed() = %v", s, info.Deployed())
		}
		if (s.String() == release.StatusUninstalled) != (s == helmrelease.StatusUninstalled) {
			t.Errorf("%s: release.StatusUninstalled is %q", s, release.StatusUninstalled)
		}
		if (s.String() == release.StatusUninstalling) != (s == helmrelease.StatusUninstalling) {
			t.Errorf("%s: release.StatusUninstalling is %q", s, release.StatusUninstalling)
		}
		if info.Pending() != s.IsPending() {
			t.Errorf("%s: Pending() = %v, Helm says %v", s, info.Pending(), s.IsPending())
		}
	}
}

// TestStorageNamesAreHelms: coordinator/release names the labels of Helm's
// release Secrets (which the controller reads from its cache instead of the
// release history); the Secret Helm's own storage driver writes for a
// revision carries them, with the release's labels (the digest).
func TestStorageNamesAreHelms(t *testing.T) {
	cs := fake.NewClientset()
	d := driver.NewSecrets(cs.CoreV1().Secrets("ns"))
	rel := &helmrelease.Release{
		Name: "native-ccm-x", Namespace: "ns", Version: 3,
		Info:   &helmrelease.Info{Status: helmrelease.StatusDeployed},
		Labels: map[string]string{release.DigestLabel: "abc"},
	}
	if err := d.Create("sh.helm.release.v1.native-ccm-x.v3", rel); err != nil {
		t.Fatal(err)
	}
	list, err := cs.CoreV1().Secrets("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("secrets: %v, %v", list, err)
	}
	s := list.Items[0]
	if string(s.Type) != release.HelmStorageType {
		t.Errorf("type %q, want %q", s.Type, release.HelmStorageType)
	}
	want := map[string]string{
		release.StorageOwnerLabel: release.StorageOwner, release.StorageNameLabel: "native-ccm-x",
		release.StorageVersionLabel: "3", release.StorageStatusLabel: release.StatusDeployed, release.DigestLabel: "abc",
	}
	for k, v := range want {
		if s.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, s.Labels[k], v, s.Labels)
		}
	}
}
