package v1alpha1

// Condition types owned by the NativeCCM reconciler, next to the generic
// meta.ReadyCondition, meta.ReconcilingCondition and meta.StalledCondition of
// github.com/fluxcd/pkg/apis/meta.
const (
	// ProfileResolvedCondition is True when the profile named by the NativeCCM
	// exists, merges with the overrides and validates.
	ProfileResolvedCondition = "ProfileResolved"

	// InstalledCondition is True when the Helm release of the native CCM is
	// deployed with the desired configuration, and False when it is absent,
	// failed, or intentionally uninstalled.
	InstalledCondition = "Installed"

	// GatedCondition is True when the release carries the gate (view proxy and
	// admission policy). It is set by the gate once that exists.
	GatedCondition = "Gated"

	// ConflictCondition is True (abnormal-true) when the cluster holds something
	// that makes running this native CCM unsafe or ineffective: another CCM with
	// the same lease name, a CCM not managed by us running cloud-node, or nodes
	// of the platform with an empty providerID.
	ConflictCondition = "Conflict"

	// NodesOwnedCondition is True when every node of the platform is owned by
	// the domain of some NativeCCM, and False (reason UnownedNodes) naming the
	// nodes no native CCM manages.
	NodesOwnedCondition = "NodesOwned"

	// HealthyCondition is True when the installed native CCM is actually
	// working: its leader-election Lease is held by one of the release's pods
	// and was renewed within the lease duration. It is absent while no release
	// is installed. Ready summarizes it: an installed release whose CCM is not
	// Healthy is not Ready.
	HealthyCondition = "Healthy"
)

// Reasons of the conditions above. Reasons are PascalCase and also used as event
// reasons.
const (
	// ProfileNotFoundReason: no built-in or override profile has the requested name.
	ProfileNotFoundReason = "ProfileNotFound"

	// InvalidProfileReason: the profile, merged with the overrides, does not validate.
	InvalidProfileReason = "InvalidProfile"

	// InvalidOverridesReason: spec.overrides try to change what the coordinator
	// enforces (controllers, lease, service account credentials, ports).
	InvalidOverridesReason = "InvalidOverrides"

	// PlatformNotRoutedReason: spec.platform is not one of the profile's platforms.
	PlatformNotRoutedReason = "PlatformNotRouted"

	// NoUpstreamForKubernetesVersionReason: the profile has no upstream CCM
	// release for the API server's minor nor one a minor older (Kubernetes'
	// skew policy); nothing is installed or upgraded, a release already
	// installed stays. Looked at again every interval: the API server may
	// change.
	NoUpstreamForKubernetesVersionReason = "NoUpstreamForKubernetesVersion"

	// UpstreamChosenReason: the event of a new upstream CCM image chosen for
	// the NativeCCM (status.upstream), a Warning when it is outside the skew
	// policy (an overridden image).
	UpstreamChosenReason = "UpstreamChosen"

	// ProfileResolvedReason: the profile resolved.
	ProfileResolvedReason = "ProfileResolved"

	// CredentialsNotFoundReason: the credentials Secret or one of its required
	// keys is missing; the reconciler waits for it.
	CredentialsNotFoundReason = "CredentialsNotFound"

	// ImagePullSecretNotFoundReason: an image pull Secret the native CCM's
	// pods are to use (spec.imagePullSecrets, or the coordinator's
	// --image-pull-secrets) is missing in the release namespace, or is not of
	// a type the kubelet reads (kubernetes.io/dockerconfigjson or
	// kubernetes.io/dockercfg); the reconciler waits for it.
	ImagePullSecretNotFoundReason = "ImagePullSecretNotFound"

	// WaitingForPreviousCCMReason: spec.takeOver names the Lease of a CCM the
	// cluster already runs, and a holder renewed it within its
	// leaseDurationSeconds: that CCM is live, so nothing is installed (two
	// CCMs would initialize and delete nodes, and serve the same Services).
	// The message names the Lease, its holder and how long ago it was
	// renewed. Uninstall the previous CCM: upstream CCMs do not release their
	// Lease when they stop, so it runs out leaseDurationSeconds after the
	// last renewal, and then the release is installed.
	WaitingForPreviousCCMReason = "WaitingForPreviousCCM"

	// PreviousCCMLeaseUnreadableReason: the Lease spec.takeOver names cannot
	// be read (the coordinator is not allowed to get it, or the API server
	// fails): whether the previous CCM is live is unknown, so nothing is
	// installed.
	PreviousCCMLeaseUnreadableReason = "PreviousCCMLeaseUnreadable"

	// PreviousCCMStoppedReason: the event of a NativeCCM that waited for the
	// previous CCM (WaitingForPreviousCCM) and is installed now: its Lease
	// ran out, has no holder or is gone.
	PreviousCCMStoppedReason = "PreviousCCMStopped"

	// InvalidTakeOverReason: spec.takeOver.lease is not <namespace>/<name>
	// (the CRD refuses such a value; an object stored before it did stalls).
	InvalidTakeOverReason = "InvalidTakeOver"

	// PreviousCCMLiveReason: the release is installed, and the Lease
	// spec.takeOver names is held and renewed again: the previous CCM runs
	// beside this one (a Conflict; the coordinator uninstalls neither).
	PreviousCCMLiveReason = "PreviousCCMLive"

	// NoNodesReason: install policy Auto and no node of the platform exists.
	NoNodesReason = "NoNodes"

	// UninstallPendingReason: the last node is gone; the release is removed when
	// the grace period ends.
	UninstallPendingReason = "UninstallPending"

	// InstallDisabledReason: install policy Never.
	InstallDisabledReason = "InstallDisabled"

	// UnsafePodSpecReason: the rendered native CCM pod asks for a host
	// namespace, a privileged container or a host path that its profile does
	// not declare; nothing was installed (Stalled until the spec, the profile
	// or the chart changes).
	UnsafePodSpecReason = "UnsafePodSpec"

	// ChartLoadFailedReason: the chart could not be fetched or loaded.
	ChartLoadFailedReason = "ChartLoadFailed"

	// InstallSucceededReason / InstallFailedReason: outcome of a Helm install.
	InstallSucceededReason = "InstallSucceeded"
	InstallFailedReason    = "InstallFailed"

	// UpgradeSucceededReason / UpgradeFailedReason: outcome of a Helm upgrade.
	UpgradeSucceededReason = "UpgradeSucceeded"
	UpgradeFailedReason    = "UpgradeFailed"

	// RollbackSucceededReason / RollbackFailedReason: outcome of the rollback that
	// remediates a failed upgrade.
	RollbackSucceededReason = "RollbackSucceeded"
	RollbackFailedReason    = "RollbackFailed"

	// UninstallSucceededReason / UninstallFailedReason: outcome of a Helm uninstall.
	UninstallSucceededReason = "UninstallSucceeded"
	UninstallFailedReason    = "UninstallFailed"

	// UpToDateReason: the deployed release already matches the desired state.
	UpToDateReason = "UpToDate"

	// LoadBalancersUnsupportedReason: spec.loadBalancers is on, but the
	// profile's CCM cannot serve LoadBalancers (the message gives the profile's
	// reason).
	LoadBalancersUnsupportedReason = "LoadBalancersUnsupported"

	// LoadBalancerClassConflictReason: another NativeCCM serves the same class,
	// or is the default for Services without a class too; the younger one does
	// not serve them until the conflict is resolved.
	LoadBalancerClassConflictReason = "LoadBalancerClassConflict"

	// LeaseNameSharedReason: another CCM uses this release's leader-election lease.
	LeaseNameSharedReason = "LeaseNameShared"

	// ForeignCloudNodeControllerReason: a CCM not managed by the coordinator runs
	// the cloud-node controller (explicitly or through "*").
	ForeignCloudNodeControllerReason = "ForeignCloudNodeController"

	// EmptyProviderIDReason: nodes of the platform have no providerID yet; a
	// native CCM must never see them (the gate hides them).
	EmptyProviderIDReason = "EmptyProviderID"

	// DomainOverlapReason: another NativeCCM of the platform owns some of the
	// same nodes (domains overlap); the younger one is not installed.
	DomainOverlapReason = "DomainOverlap"

	// DomainSpansBoundaryReason: the NativeCCM's nodes carry several values of
	// the profile's boundary label (an aws CCM sees one region): one CCM
	// would delete the others' nodes as "not found". Nothing is installed
	// (an installed release is removed) until the domain is narrowed or split.
	DomainSpansBoundaryReason = "DomainSpansBoundary"

	// InvalidDomainReason: spec.domain cannot be enforced: a selector the
	// fence cannot check (a label it does not know, an operator other than
	// In), a split of a profile without a boundary label, or values that make
	// no release name.
	InvalidDomainReason = "InvalidDomain"

	// UnownedNodesReason: nodes of the platform are in no NativeCCM's domain.
	UnownedNodesReason = "UnownedNodes"

	// AllNodesOwnedReason: every node of the platform is in a domain.
	AllNodesOwnedReason = "AllNodesOwned"

	// LoadBalancersRemainReason: the release would be uninstalled, but
	// Services it served still carry the cloud's cleanup finalizer
	// (service.kubernetes.io/load-balancer-cleanup): uninstalling would
	// orphan their load balancers and leave the Services stuck in deletion.
	LoadBalancersRemainReason = "LoadBalancersRemain"

	// NoConflictReason: none of the conflicts above was found.
	NoConflictReason = "NoConflict"
)

// Reasons of the Healthy condition, also used for Ready while the release is
// installed but its CCM is not working. The first three are transient (the CCM
// is starting or a new pod is taking over): the NativeCCM is Reconciling. The
// last three are failures: Ready=False without Reconciling.
const (
	// LeaseRenewedReason: a pod of the release holds the lease and renewed it
	// within the lease duration.
	LeaseRenewedReason = "LeaseRenewed"

	// NoRunningPodsReason: the release has no running pod (not yet scheduled,
	// pulling its image, ...).
	NoRunningPodsReason = "NoRunningPods"

	// LeaseNotFoundReason: pods run but the lease does not exist or nobody
	// holds it: no pod has become leader yet.
	LeaseNotFoundReason = "LeaseNotFound"

	// LeaderGoneReason: the lease is held by a pod of the release that no
	// longer exists and has not expired yet; another pod takes over when it does.
	LeaderGoneReason = "LeaderGone"

	// CrashLoopingReason: a container of the release's pods restarts
	// repeatedly (or waits in CrashLoopBackOff) and no pod leads; the
	// container's last termination message is in the condition message.
	CrashLoopingReason = "CrashLooping"

	// LeaseNotRenewedReason: the lease was not renewed within its duration:
	// the leader hangs or is gone and no other pod took over.
	LeaseNotRenewedReason = "LeaseNotRenewed"

	// LeaseHeldByForeignIdentityReason: a current holder of the release's lease
	// is not a pod of the release: another process uses the same lease, and
	// the release's CCM waits for ever.
	LeaseHeldByForeignIdentityReason = "LeaseHeldByForeignIdentity"
)
