package v1alpha1

import (
	"strings"

	"github.com/fluxcd/pkg/apis/meta"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	// NativeCCMKind is the kind of NativeCCM.
	NativeCCMKind = "NativeCCM"

	// Finalizer makes the coordinator uninstall the release before a NativeCCM goes.
	Finalizer = "hybridccm.io/finalizer"
)

// InstallPolicy says when the native CCM release exists.
// +kubebuilder:validation:Enum=Auto;Always;Never
type InstallPolicy string

const (
	// InstallAuto installs when at least one node of the platform exists and the
	// credentials are present, and uninstalls after a grace period once the last
	// node is gone.
	InstallAuto InstallPolicy = "Auto"
	// InstallAlways installs as soon as the credentials are present, with or
	// without nodes.
	InstallAlways InstallPolicy = "Always"
	// InstallNever keeps the release uninstalled (and uninstalls an existing one).
	InstallNever InstallPolicy = "Never"
)

// NativeCCMSpec is the desired native CCM of one platform.
type NativeCCMSpec struct {
	// Platform is the value of the node label
	// node.cloudprovider.kubernetes.io/platform whose nodes this CCM manages.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Platform string `json:"platform"`

	// Profile names the profile (built-in or override) that describes how to run
	// the CCM. Defaults to Platform.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Profile string `json:"profile,omitempty"`

	// Overrides change the profile's image, args, env and chart values for this
	// NativeCCM. What the coordinator enforces (lifecycle-only controllers, lease,
	// service account, ports) cannot be overridden.
	// +optional
	Overrides *Overrides `json:"overrides,omitempty"`

	// Credentials reference the Secret holding the cloud credentials, in the
	// coordinator's release namespace. Defaults to the profile's Secret name.
	// +optional
	Credentials *Credentials `json:"credentials,omitempty"`

	// ImagePullSecrets name Secrets of type kubernetes.io/dockerconfigjson in
	// the coordinator's release namespace that the native CCM's pods pull
	// their images with (the CCM's and the ccm-gate sidecar's), after those
	// the coordinator gives every native CCM (--image-pull-secrets). The
	// coordinator neither copies nor reads them beyond their type: it waits
	// (Ready=False, ImagePullSecretNotFound) while one is missing.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []SecretReference `json:"imagePullSecrets,omitempty"`

	// Install is the install policy.
	// +kubebuilder:default=Auto
	// +optional
	Install InstallPolicy `json:"install,omitempty"`

	// UninstallGracePeriod is how long Auto keeps the release after the last
	// node of the platform is gone. Defaults to the coordinator's setting.
	// +optional
	UninstallGracePeriod *metav1.Duration `json:"uninstallGracePeriod,omitempty"`

	// Suspend stops reconciliation; the release is left as it is.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// LoadBalancers turns on the CCM's service controller for Services of type
	// LoadBalancer of its class (and, when it is the default, those without a
	// class), with only its own domain's nodes as targets.
	// +optional
	LoadBalancers *LoadBalancers `json:"loadBalancers,omitempty"`

	// Domain narrows the nodes this CCM owns from every node of the platform
	// to those one CCM of the cloud can see with its credentials and cloud
	// config: a region, an account, a project. Several NativeCCMs may serve
	// one platform with disjoint domains. Absent: every node of the platform
	// (refused when the profile knows the cloud's boundary and the nodes
	// span it: an aws CCM sees one region).
	// +optional
	Domain *Domain `json:"domain,omitempty"`

	// TakeOver names the CCM this NativeCCM replaces: a cloud CCM the
	// cluster already runs on its own (cluster-wide, with its own lease).
	// While that CCM is live the release is not installed: Ready=False with
	// reason WaitingForPreviousCCM, until its Lease stops being renewed.
	// +optional
	TakeOver *TakeOver `json:"takeOver,omitempty"`
}

// TakeOver names the CCM a NativeCCM replaces by its leader-election Lease.
type TakeOver struct {
	// Lease is <namespace>/<name> of the previous CCM's leader-election Lease
	// (for every CCM built on k8s.io/cloud-provider that runs with its
	// defaults, kube-system/cloud-controller-manager). While the Lease has a
	// holder that renewed it within its leaseDurationSeconds, the coordinator
	// installs nothing for this NativeCCM. The coordinator must be allowed to
	// get that Lease (the hybrid-ccm chart grants it from
	// clouds.<name>.takeOver.lease).
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="spec.takeOver.lease must be <namespace>/<name> of a Lease, e.g. kube-system/cloud-controller-manager: a namespace (a DNS label of at most 63 characters), a slash, and a Lease name (a DNS subdomain)"
	// +kubebuilder:validation:XValidation:rule="self.size() - self.indexOf('/') <= 254",message="spec.takeOver.lease must be <namespace>/<name> of a Lease: a Lease name is at most 253 characters"
	Lease string `json:"lease"`
}

// LeaseKey splits spec.takeOver.lease into namespace and name; ok is false
// when it is not <namespace>/<name> of a Lease: a namespace (a DNS label)
// and a Lease name (a DNS subdomain, at most 253 characters, which the CRD's
// rule does not bound; it refuses the rest).
func (t *TakeOver) LeaseKey() (namespace, name string, ok bool) {
	if t == nil {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(t.Lease, "/")
	return namespace, name, ok && len(validation.IsDNS1123Label(namespace)) == 0 && len(validation.IsDNS1123Subdomain(name)) == 0
}

// Domain is the part of a platform's nodes one NativeCCM owns.
type Domain struct {
	// Selector is what a node of the platform must carry to be owned:
	// matchLabels, and matchExpressions with the operator In, on labels the
	// fence knows (the profiles' domain labels, e.g.
	// topology.kubernetes.io/region, and node.cloudprovider.kubernetes.io/domain,
	// which a talos-ccm rule can set from metadata). The view shows only
	// these nodes and the fence refuses every write to others.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator == 'In')",message="a domain selector's matchExpressions may only use the operator In: the fence enforces equality and set membership"
	Selector *metav1.LabelSelector `json:"selector,omitempty"`

	// SplitBy splits the NativeCCM into one release per value of this node
	// label among its nodes: member native-ccm-<name>--<value>, with its own
	// ServiceAccount, lease and cloud config (that value as the cloud
	// config's region), its view and fence narrowed to the nodes with that
	// value. It must be the profile's domain.boundaryLabel (for aws
	// topology.kubernetes.io/region), and the grant must name it
	// (fence.hybridccm.io splits/<label>). A split NativeCCM serves no load
	// balancers.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	SplitBy string `json:"splitBy,omitempty"`
}

// DomainLabel is the node label a talos-ccm transformation rule sets where a
// cloud's boundary is in no label of its own (a Hetzner project, a GCP
// project, an Azure subscription): kubelets cannot set it (NodeRestriction
// keeps *.kubernetes.io labels), and the fence knows it for every platform.
const DomainLabel = "node.cloudprovider.kubernetes.io/domain"

// LoadBalancers of one NativeCCM.
// +kubebuilder:validation:XValidation:rule="!has(self.class) || self.class.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$')",message="class must be a prefixed name such as hybridccm.io/aws (what spec.loadBalancerClass of a Service accepts)"
type LoadBalancers struct {
	// Enabled runs the service controller.
	Enabled bool `json:"enabled"`
	// Class is the spec.loadBalancerClass of the Services this CCM serves.
	// Defaults to hybridccm.io/<platform>.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Class string `json:"class,omitempty"`
	// Default also serves Services of type LoadBalancer without a class. At most
	// one NativeCCM can be the default; a second one gets a Conflict.
	// +optional
	Default bool `json:"default,omitempty"`
}

// LoadBalancerClassPrefix starts the default class of a NativeCCM's Services.
const LoadBalancerClassPrefix = "hybridccm.io/"

// Overrides of the profile for one NativeCCM.
type Overrides struct {
	// Image replaces the profile's image repository and/or tag.
	// +optional
	Image *Image `json:"image,omitempty"`

	// Args are appended to the profile's args, each one --name=value
	// argument: a flag without "=" would take the next argument (a flag the
	// coordinator enforces) as its value, so a boolean is written --name=true.
	// Flags the coordinator enforces are rejected.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="self.all(a, a.matches('^--[A-Za-z0-9][-A-Za-z0-9_.]*=[^\\n\\r]*$'))",messageExpression="'every arg must be one --name=value argument (a boolean flag as --name=true): ' + self.filter(a, !a.matches('^--[A-Za-z0-9][-A-Za-z0-9_.]*=[^\\n\\r]*$'))[0] + ' is not; a flag without a value would take the next argument, a flag the coordinator enforces, as its value'"
	Args []string `json:"args,omitempty"`

	// Env entries replace the profile's entries of the same name or are added.
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`

	// Values are merged over the chart values derived from the profile.
	// +optional
	Values *apiextensionsv1.JSON `json:"values,omitempty"`
}

// Image is a container image reference split into repository and tag.
type Image struct {
	// +optional
	Repository string `json:"repository,omitempty"`
	// +optional
	Tag string `json:"tag,omitempty"`
}

// SecretReference names a Secret in the coordinator's release namespace.
type SecretReference struct {
	// Name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// Credentials of the cloud API.
type Credentials struct {
	// SecretRef names a Secret in the coordinator's release namespace.
	// +required
	SecretRef meta.LocalObjectReference `json:"secretRef"`
}

// ReleaseStatus describes the Helm release of the native CCM.
type ReleaseStatus struct {
	// Name of the Helm release.
	Name string `json:"name"`
	// Namespace of the Helm release.
	Namespace string `json:"namespace"`
	// Revision of the last release the coordinator observed.
	// +optional
	Revision int `json:"revision,omitempty"`
	// Chart is name@version of the released chart.
	// +optional
	Chart string `json:"chart,omitempty"`
	// Status is the Helm status of that revision (deployed, failed, ...).
	// +optional
	Status string `json:"status,omitempty"`
	// Digest of the desired configuration (chart, values, enforcement) that
	// revision was made from.
	// +optional
	Digest string `json:"digest,omitempty"`
}

// LeaderStatus is the leader-election Lease of the native CCM as last observed.
type LeaderStatus struct {
	// Lease is namespace/name of the leader-election Lease.
	Lease string `json:"lease"`
	// Holder is the lease's holderIdentity (client-go writes
	// <hostname>_<uuid>; a pod's hostname is its name).
	// +optional
	Holder string `json:"holder,omitempty"`
	// Pod is the release pod holding the lease, when the holder is one.
	// +optional
	Pod string `json:"pod,omitempty"`
	// RenewTime is when the holder last renewed the lease.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// LeaseDurationSeconds is how long the lease is valid after a renewal.
	// +optional
	LeaseDurationSeconds int32 `json:"leaseDurationSeconds,omitempty"`
}

// GateStatus is what the fence enforces for the native CCM, as the
// coordinator found it before the last install or upgrade: for people and
// tools. The fence (one ValidatingAdmissionPolicy the ccm-coordinator chart
// ships, without parameters) reads no NativeCCM: it confines the
// ServiceAccount native-ccm-<name> to what its grant (ClusterRole and
// ClusterRoleBinding hybrid-ccm:fence:<name>, made with the NativeCCM) names,
// with the providerID prefixes of the platform it holds itself.
type GateStatus struct {
	// Policy is the name of the fence's ValidatingAdmissionPolicy.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Policy string `json:"policy,omitempty"`
	// ServiceAccount is namespace/name of the native CCM's ServiceAccount, the
	// identity the fence confines.
	// +optional
	// +kubebuilder:validation:MaxLength=317
	ServiceAccount string `json:"serviceAccount,omitempty"`
	// ProviderIDPrefixes are the profile's providerID prefixes, which the
	// fence knows for the platform: the native CCM may change only nodes whose
	// providerID starts with one of the platform's prefixes (and that carry
	// its platform label).
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MinLength=4
	// +kubebuilder:validation:items:MaxLength=64
	ProviderIDPrefixes []string `json:"providerIDPrefixes,omitempty"`
	// LoadBalancers are the Services the CCM serves: absent while
	// spec.loadBalancers is off or in conflict with another NativeCCM.
	// +optional
	LoadBalancers *GateLoadBalancers `json:"loadBalancers,omitempty"`
}

// GateLoadBalancers are the Services a native CCM serves (its grant must name
// them too).
type GateLoadBalancers struct {
	// Class of the Services it serves.
	// +kubebuilder:validation:MaxLength=253
	Class string `json:"class"`
	// Default: it also serves Services without a class.
	// +optional
	Default bool `json:"default,omitempty"`
}

// UpstreamStatus is the upstream CCM release the coordinator chose for the
// API server's Kubernetes minor (the profile's ccm.image.tags), or the one
// spec.overrides.image names.
type UpstreamStatus struct {
	// Image is repository:tag of the CCM container.
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`
	// Source says where the tag came from: Profile (its release for a
	// Kubernetes minor), ProfileDefault (its one release for every minor,
	// ccm.image.tag) or Override (spec.overrides.image).
	// +kubebuilder:validation:Enum=Profile;ProfileDefault;Override
	Source string `json:"source"`
	// KubernetesMinor is the Kubernetes minor the release is for (1.N), when
	// known.
	// +optional
	// +kubebuilder:validation:MaxLength=8
	KubernetesMinor string `json:"kubernetesMinor,omitempty"`
	// APIServerVersion is the API server's version the choice was last made
	// (or checked) for.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	APIServerVersion string `json:"apiServerVersion,omitempty"`
	// Skew is how many minors the release is older than the API server
	// (negative: newer). Kubernetes allows 0 and 1. Absent when the
	// release's minor is unknown.
	// +optional
	Skew *int32 `json:"skew,omitempty"`
	// NodeFilter is how the upstream CCM itself leaves other platforms'
	// nodes alone, a second layer behind the gate; absent when this release
	// cannot.
	// +optional
	NodeFilter *NodeFilterStatus `json:"nodeFilter,omitempty"`
}

// NodeFilterStatus is the upstream CCM's own filter of foreign nodes.
type NodeFilterStatus struct {
	// Args the CCM runs with for it (e.g. --node-filter-requirements=...).
	// +optional
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:MaxLength=512
	Args []string `json:"args,omitempty"`
	// ForeignNodeLabels are the labels (key=value) a node of another
	// platform must carry for the CCM to leave it alone; a talos-ccm rule
	// puts them there (docs/profiles.md).
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=317
	ForeignNodeLabels []string `json:"foreignNodeLabels,omitempty"`
}

// NativeCCMStatus is what the coordinator observed.
type NativeCCMStatus struct {
	// ObservedGeneration is the last generation fully reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling, Stalled, ProfileResolved, Installed,
	// Gated, Conflict, Healthy.
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Nodes is the number of nodes labelled with the platform.
	// +kubebuilder:default=0
	// +optional
	Nodes int32 `json:"nodes"`

	// NodesWithoutProviderID is how many of those nodes have no providerID.
	// +optional
	NodesWithoutProviderID int32 `json:"nodesWithoutProviderID,omitempty"`

	// NoNodesSince is when the last node of the platform was seen going; the
	// grace period of Auto counts from here.
	// +optional
	NoNodesSince *metav1.Time `json:"noNodesSince,omitempty"`

	// Upstream is the upstream CCM release chosen for the API server.
	// +optional
	Upstream *UpstreamStatus `json:"upstream,omitempty"`

	// Release is the Helm release, when one exists.
	// +optional
	Release *ReleaseStatus `json:"release,omitempty"`

	// Leader is the native CCM's leader-election Lease while a release is
	// installed and the Lease exists.
	// +optional
	Leader *LeaderStatus `json:"leader,omitempty"`

	// Gate is what the fence enforces for this native CCM, written before any
	// release is installed.
	// +optional
	Gate *GateStatus `json:"gate,omitempty"`

	// UnownedNodes is how many nodes of the platform no NativeCCM's domain
	// covers (no native CCM manages their lifecycle).
	// +optional
	UnownedNodes int32 `json:"unownedNodes,omitempty"`

	// BoundaryValue is the value of the profile's boundary label (the
	// region, for aws) that the nodes of a NativeCCM without a selector on
	// that label carried while its release ran: the one region its CCM is
	// configured for. When its nodes later span several values, the
	// installed CCM is kept to this one (its view narrowed) instead of being
	// shown the others, which it would delete as not found.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	BoundaryValue string `json:"boundaryValue,omitempty"`

	// Members are the releases of a split NativeCCM (spec.domain.splitBy),
	// one per value of the split label among its nodes, sorted by value.
	// +optional
	// +listType=map
	// +listMapKey=value
	// +kubebuilder:validation:MaxItems=64
	Members []MemberStatus `json:"members,omitempty"`

	// Failures counts consecutive failed install/upgrade attempts.
	// +optional
	Failures int64 `json:"failures,omitempty"`

	meta.ReconcileRequestStatus `json:",inline"`
}

// MemberStatus is one release of a split NativeCCM.
type MemberStatus struct {
	// Value of the split label the member serves.
	// +kubebuilder:validation:MaxLength=63
	Value string `json:"value"`
	// Release is the member's Helm release (and ServiceAccount, lease) name,
	// native-ccm-<name>--<value>.
	// +kubebuilder:validation:MaxLength=253
	Release string `json:"release"`
	// Revision of the release last observed.
	// +optional
	Revision int `json:"revision,omitempty"`
	// Nodes is the number of the NativeCCM's nodes with that value.
	// +optional
	Nodes int32 `json:"nodes"`
	// Ready: the release is deployed from the desired state and its CCM
	// leads (renews its lease).
	// +optional
	Ready bool `json:"ready"`
	// Reason is a PascalCase reason for Ready (as the NativeCCM's conditions
	// give it).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Reason string `json:"reason,omitempty"`
	// Message says what the member's release is doing or why it is not ready.
	// +optional
	// +kubebuilder:validation:MaxLength=32768
	Message string `json:"message,omitempty"`
	// NoNodesSince is when the value's last node was seen going; the member
	// is uninstalled after the uninstall grace period.
	// +optional
	NoNodesSince *metav1.Time `json:"noNodesSince,omitempty"`
}

// MemberReleaseName is the release of the member of a split NativeCCM for
// value: native-ccm-<name>--<value>.
func (in *NativeCCM) MemberReleaseName(value string) string {
	return in.ReleaseName() + "--" + value
}

// NativeCCM runs the unmodified upstream cloud-controller-manager of one platform
// in lifecycle-only mode, for that platform's nodes only.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nccm;nccms,categories=hybrid-ccm
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 42",message="name must be at most 42 characters (it prefixes the Helm release name)"
// +kubebuilder:printcolumn:name="Platform",type=string,JSONPath=`.spec.platform`
// +kubebuilder:printcolumn:name="Install",type=string,JSONPath=`.spec.install`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Revision",type=integer,JSONPath=`.status.release.revision`
// +kubebuilder:printcolumn:name="Chart",type=string,JSONPath=`.status.release.chart`,priority=1
// +kubebuilder:printcolumn:name="Upstream",type=string,JSONPath=`.status.upstream.image`,priority=1
// +kubebuilder:printcolumn:name="Skew",type=integer,JSONPath=`.status.upstream.skew`,priority=1
// +kubebuilder:printcolumn:name="Leader",type=string,JSONPath=`.status.leader.holder`
// +kubebuilder:printcolumn:name="Renewed",type=date,JSONPath=`.status.leader.renewTime`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Conflict",type=string,JSONPath=`.status.conditions[?(@.type=="Conflict")].status`,priority=1
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NativeCCM struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec NativeCCMSpec `json:"spec"`
	// +optional
	Status NativeCCMStatus `json:"status,omitempty"`
}

// GetConditions returns the status conditions (conditions.Getter).
func (in *NativeCCM) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions (conditions.Setter).
func (in *NativeCCM) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

// ProfileName is the profile to use: spec.profile, or the platform.
func (in *NativeCCM) ProfileName() string {
	if in.Spec.Profile != "" {
		return in.Spec.Profile
	}
	return in.Spec.Platform
}

// InstallPolicy returns spec.install with its default.
func (in *NativeCCM) InstallPolicy() InstallPolicy {
	if in.Spec.Install == "" {
		return InstallAuto
	}
	return in.Spec.Install
}

// LoadBalancerClass is the class of the Services this NativeCCM serves when
// spec.loadBalancers is enabled: spec.loadBalancers.class or
// hybridccm.io/<platform>.
func (in *NativeCCM) LoadBalancerClass() string {
	if in.Spec.LoadBalancers != nil && in.Spec.LoadBalancers.Class != "" {
		return in.Spec.LoadBalancers.Class
	}
	return LoadBalancerClassPrefix + in.Spec.Platform
}

// LoadBalancersEnabled reports spec.loadBalancers.enabled.
func (in *NativeCCM) LoadBalancersEnabled() bool {
	return in.Spec.LoadBalancers != nil && in.Spec.LoadBalancers.Enabled
}

// ReleasePrefix is what ReleaseName puts before the NativeCCM's name.
const ReleasePrefix = "native-ccm-"

// ReleaseName is the Helm release (and lease, ServiceAccount) name of this NativeCCM.
func (in *NativeCCM) ReleaseName() string { return ReleasePrefix + in.Name }

// +kubebuilder:object:root=true

// NativeCCMList is a list of NativeCCM.
type NativeCCMList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NativeCCM `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NativeCCM{}, &NativeCCMList{})
}
