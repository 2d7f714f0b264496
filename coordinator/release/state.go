package release

import (
	"errors"
	"slices"
)

// DigestLabel is the release label holding Request.Digest.
const DigestLabel = "hybridccm.io/digest"

// Statuses of a release revision, as Info.Status carries them (Helm's names;
// coordinator/release/helm checks that they match).
const (
	StatusDeployed        = "deployed"
	StatusPendingInstall  = "pending-install"
	StatusPendingUpgrade  = "pending-upgrade"
	StatusPendingRollback = "pending-rollback"
	// StatusUninstalled: a release uninstalled with its history kept;
	// StatusUninstalling: one being uninstalled.
	StatusUninstalled  = "uninstalled"
	StatusUninstalling = "uninstalling"
)

// Info describes the latest revision of a release, as an engine found it.
type Info struct {
	Name      string
	Namespace string
	// Revision is the latest revision number.
	Revision int
	// Status is the status of that revision (deployed, failed, pending-install, ...).
	Status string
	// Chart is name@version.
	Chart string
	// Digest is the request digest the revision was made from.
	Digest string
	// LastDeployed is the newest revision that was deployed successfully
	// (deployed or superseded), 0 when none was.
	LastDeployed int
}

// Deployed is true when the latest revision is deployed.
func (i *Info) Deployed() bool { return i != nil && i.Status == StatusDeployed }

// Pending is true when the latest revision is stuck in a pending state.
func (i *Info) Pending() bool {
	return i != nil && slices.Contains([]string{StatusPendingInstall, StatusPendingUpgrade, StatusPendingRollback}, i.Status)
}

// ChartError is a failure to fetch or load a chart: nothing was sent to the
// cluster.
type ChartError struct{ Err error }

func (e *ChartError) Error() string { return "load chart: " + e.Err.Error() }
func (e *ChartError) Unwrap() error { return e.Err }

// ErrNameInUse: Install found the release already there (someone — usually an
// earlier reconcile whose status the caller has not seen yet — installed it).
var ErrNameInUse = errors.New("release already exists")

// Helm's release storage: one Secret per revision, of type HelmStorageType,
// labelled StorageOwnerLabel=StorageOwner, StorageNameLabel=<release>,
// StorageVersionLabel=<revision> and StorageStatusLabel=<status>, plus the
// release's own labels (DigestLabel). coordinator/release/helm checks that
// these are Helm's names.
const (
	HelmStorageType     = "helm.sh/release.v1"
	StorageOwnerLabel   = "owner"
	StorageOwner        = "helm"
	StorageNameLabel    = "name"
	StorageVersionLabel = "version"
	StorageStatusLabel  = "status"
)
