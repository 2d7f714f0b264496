package helm

import (
	"testing"

	helmrelease "helm.sh/helm/v3/pkg/release"

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
		if info.Pending() != s.IsPending() {
			t.Errorf("%s: Pending() = %v, Helm says %v", s, info.Pending(), s.IsPending())
		}
	}
}
