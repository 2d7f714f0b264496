// Package profile owns the description of one cloud's native CCM: which platform
// names it routes, which providerIDs belong to it, and how its unmodified upstream
// CCM runs in lifecycle-only mode (image, args, env, credentials, chart).
//
// It loads profiles strictly (unknown fields are errors), merges user overrides
// over the built-in ones, and validates the result with errors that name the file,
// the profile and the field. It chooses the upstream CCM release for an API
// server's Kubernetes minor (Kubernetes' version skew policy) and whether that
// release gets its own node filter (ChooseUpstream); the caller tells it the
// minor. It must not talk to the cluster or to Helm.
package profile

// APIVersion and Kind identify a profile document.
const (
	APIVersion = "hybridccm.io/v1alpha1"
	Kind       = "Profile"
)

// Profile describes how to run one cloud's native CCM for its own nodes only.
type Profile struct {
	// APIVersion must be hybridccm.io/v1alpha1.
	APIVersion string `json:"apiVersion"`
	// Kind must be Profile.
	Kind string `json:"kind"`
	// Name is the profile name NativeCCMs refer to (spec.profile).
	Name string `json:"name"`
	// Description is one line for humans.
	Description string `json:"description,omitempty"`
	// Platforms are the values of node.cloudprovider.kubernetes.io/platform this
	// profile can route (Talos platform names, or a value set by a transformation).
	Platforms []string `json:"platforms"`
	// ProviderIDPrefixes are the providerID prefixes of this cloud's nodes.
	ProviderIDPrefixes []string `json:"providerIDPrefixes"`
	// CCM says how the upstream CCM container runs.
	CCM CCM `json:"ccm"`
	// Credentials are the Secret and keys the CCM needs.
	Credentials Credentials `json:"credentials"`
	// Chart is where the manifests come from.
	Chart Chart `json:"chart"`
	// OptOutLabels are node labels the upstream CCM itself honours to leave a
	// node alone (informational; the gate does not depend on them).
	OptOutLabels []OptOutLabel `json:"optOutLabels,omitempty"`
	// LoadBalancers says how the CCM serves Services of type LoadBalancer
	// (NativeCCM spec.loadBalancers), or why it cannot.
	LoadBalancers *LoadBalancers `json:"loadBalancers,omitempty"`
	// Domain says what bounds the nodes one CCM of this cloud can see (a
	// region, a project): a node beyond it is "not found" and deleted by the
	// CCM's lifecycle controller.
	Domain *Domain `json:"domain,omitempty"`
	// Quirks are known behaviours of the upstream CCM and how this profile
	// mitigates them.
	Quirks []Quirk `json:"quirks,omitempty"`
	// Sources are where the facts in this profile come from.
	Sources []string `json:"sources,omitempty"`
}

// Domain is the boundary of what one CCM of the cloud sees.
type Domain struct {
	// BoundaryLabel is the node label whose value one CCM is limited to
	// (topology.kubernetes.io/region for aws and openstack); empty when no
	// label says it (a Hetzner project: docs/profiles.md shows the talos-ccm
	// rule that sets node.cloudprovider.kubernetes.io/domain instead). A
	// NativeCCM whose nodes carry several values of it is refused.
	// +optional
	BoundaryLabel string `json:"boundaryLabel,omitempty"`
	// CloudConfigRegion is the setting of the cloud-config file
	// (ccm.cloudConfig, an INI file) that configures the boundary value, as
	// Section.key (aws: Global.Region). A NativeCCM split by the boundary
	// label (spec.domain.splitBy) runs each member with the credentials
	// Secret's cloud config and this setting set to the member's value.
	// Empty: the profile cannot split (a split NativeCCM is refused).
	// +optional
	CloudConfigRegion string `json:"cloudConfigRegion,omitempty"`
	// Notes say what bounds the CCM and where upstream says so.
	// +optional
	Notes string `json:"notes,omitempty"`
}

// CCM is the upstream CCM container.
type CCM struct {
	// Image of the upstream CCM.
	Image Image `json:"image"`
	// CloudProvider is the value of --cloud-provider.
	CloudProvider string `json:"cloudProvider"`
	// Args are extra flags. Flags the coordinator enforces are rejected.
	Args []string `json:"args,omitempty"`
	// Env are plain environment variables.
	Env []EnvVar `json:"env,omitempty"`
	// SecurePort is the CCM's --secure-port; unique across profiles so that
	// co-scheduled hostNetwork pods never clash.
	SecurePort int32 `json:"securePort"`
	// HostNetwork runs the pod in the host network namespace.
	HostNetwork bool `json:"hostNetwork,omitempty"`
	// CloudConfig is the cloud-config file taken from the credentials Secret.
	CloudConfig *CloudConfig `json:"cloudConfig,omitempty"`
	// NodeFilter is how the upstream CCM itself leaves other platforms'
	// nodes alone, in the releases that can: a second layer behind the gate.
	NodeFilter *NodeFilter `json:"nodeFilter,omitempty"`
	// TokenAudiences are the audiences of ServiceAccount tokens a chart may
	// project into the CCM's pod (a cloud's workload identity, e.g.
	// sts.amazonaws.com). Every other token projection is refused: a token
	// for an audience the API server accepts would let the CCM around the
	// gate. Never list an audience of the API server (its
	// --api-audiences, by default its --service-account-issuer).
	TokenAudiences []string `json:"tokenAudiences,omitempty"`
}

// Image is the upstream CCM's container image: a repository and its
// release per Kubernetes minor (Tags), or one release for every minor (Tag).
type Image struct {
	// Repository, e.g. docker.io/hetznercloud/hcloud-cloud-controller-manager.
	Repository string `json:"repository"`
	// Tag is one release for every Kubernetes minor (a CCM with its own
	// versioning, e.g. v1.26.0). Set, it wins over Tags: a profile override
	// that sets it pins that release. Its Kubernetes minor is the one Tags
	// lists it for, else unknown (and no skew is reported).
	Tag string `json:"tag,omitempty"`
	// Tags are the releases per Kubernetes minor, keyed "1.N" (the minor of
	// the k8s.io/cloud-provider the release is built with): without Tag, the
	// coordinator runs the release for the API server's minor, else the one
	// a minor older (Kubernetes' skew policy: a CCM may be one minor older
	// than the API server, never newer).
	Tags map[string]string `json:"tags,omitempty"`
}

// NodeFilter is an upstream CCM's own filter of the nodes it manages.
type NodeFilter struct {
	// SelectorFlag is a flag of the CCM that takes a label selector of the
	// nodes it manages (Azure's --node-filter-requirements): the CCM gets
	// <flag>=node.cloudprovider.kubernetes.io/platform=<its platform>.
	SelectorFlag string `json:"selectorFlag,omitempty"`
	// ForeignNodeLabels are labels a node must carry for the CCM to leave
	// it alone (GCP's components.gke.io/gke-unmanaged-node=true): the
	// NativeCCM reports them, and a talos-ccm rule puts them on the other
	// platforms' nodes (docs/profiles.md).
	ForeignNodeLabels map[string]string `json:"foreignNodeLabels,omitempty"`
	// FiltersServices: the selector applies to every informer of the CCM,
	// its Services too (Azure's: one filtered informer factory), so its
	// service controller would see only Services with the platform label.
	// With load balancers on (NativeCCM spec.loadBalancers) the flag is left
	// out and the gate alone keeps foreign nodes away.
	FiltersServices bool `json:"filtersServices,omitempty"`
	// Since are the first releases that have the filter, one per release
	// line (major.minor of the tag, e.g. v1.33.3 and v1.34.0): a release
	// has it when it is at least the entry of its line, or of a line newer
	// than every entry's. Another tag (not semantic, or of an older line)
	// does not, and the CCM then gets no flag.
	Since []string `json:"since"`
}

// EnvVar is a plain environment variable.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// CloudConfig is a file mounted from the credentials Secret and passed with a flag.
type CloudConfig struct {
	// Key in the credentials Secret.
	Key string `json:"key"`
	// Path the file is mounted at inside the container.
	Path string `json:"path"`
	// Flag that passes the path, default --cloud-config.
	Flag string `json:"flag,omitempty"`
}

// FlagName returns Flag or --cloud-config.
func (c CloudConfig) FlagName() string {
	if c.Flag == "" {
		return "--cloud-config"
	}
	return c.Flag
}

// Credentials describe the Secret the CCM reads its cloud credentials from.
type Credentials struct {
	// SecretName is the default Secret name (a NativeCCM may name another).
	SecretName string `json:"secretName"`
	// Env maps Secret keys to environment variables.
	Env []SecretEnv `json:"env,omitempty"`
	// EnvFrom exposes every key of the Secret as an environment variable;
	// RequiredKeys then lists the keys that must be present.
	EnvFrom bool `json:"envFrom,omitempty"`
	// RequiredKeys must exist in the Secret (in addition to the non-optional
	// Env keys and the cloud-config key).
	RequiredKeys []string `json:"requiredKeys,omitempty"`
	// None is true for CCMs that authenticate without a Secret (e.g. instance
	// roles); then no Secret is required.
	None bool `json:"none,omitempty"`
}

// SecretEnv is an environment variable taken from a Secret key.
type SecretEnv struct {
	// Name of the environment variable.
	Name string `json:"name"`
	// Key in the Secret.
	Key string `json:"key"`
	// Optional keys may be missing.
	Optional bool `json:"optional,omitempty"`
}

// ChartSource says where a chart comes from.
type ChartSource string

const (
	// ChartBuiltin is the project's generic lifecycle-only chart, embedded.
	ChartBuiltin ChartSource = "builtin"
	// ChartRepository is a chart in an HTTP(S) chart repository (index.yaml).
	ChartRepository ChartSource = "repository"
	// ChartOCI is a chart in an OCI registry.
	ChartOCI ChartSource = "oci"
)

// Chart is the chart the CCM is installed from.
type Chart struct {
	// Source: builtin, repository or oci.
	Source ChartSource `json:"source"`
	// Repository URL: https://... for repository, oci://host/path for oci.
	Repository string `json:"repository,omitempty"`
	// Name of the chart in the repository.
	Name string `json:"name,omitempty"`
	// Version (exact or semver constraint) of the chart.
	Version string `json:"version,omitempty"`
	// Values for an upstream chart. String values are Go templates over
	// ValuesContext ({{ .SecretName }}, {{ .LeaseName }}, ...).
	Values map[string]any `json:"values,omitempty"`
	// Workload identifies the CCM workload in the rendered manifests; default:
	// the only Deployment or DaemonSet.
	Workload *Workload `json:"workload,omitempty"`
	// Drop removes rendered objects (e.g. a node-manager DaemonSet).
	Drop []ObjectMatch `json:"drop,omitempty"`
}

// Workload selects the CCM's Deployment or DaemonSet and container.
type Workload struct {
	// Kind: Deployment or DaemonSet.
	Kind string `json:"kind,omitempty"`
	// Name is a regular expression matched against the object name.
	Name string `json:"name,omitempty"`
	// Container is the CCM container's name; default: the first container.
	Container string `json:"container,omitempty"`
}

// ObjectMatch selects rendered objects by kind and name.
type ObjectMatch struct {
	// Kind of the object.
	Kind string `json:"kind"`
	// Name is a regular expression matched against the whole object name.
	Name string `json:"name"`
	// Reason says why it is dropped.
	Reason string `json:"reason,omitempty"`
}

// OptOutLabel is a node label an upstream CCM honours.
type OptOutLabel struct {
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
	Note  string `json:"note,omitempty"`
}

// LoadBalancers is how a CCM's service controller is turned on. Absent or
// with Unsupported set, a NativeCCM that enables load balancers is refused.
type LoadBalancers struct {
	// Controller is the name of the service controller in --controllers
	// (k8s.io/cloud-provider's is "service").
	Controller string `json:"controller,omitempty"`
	// Env replaces the CCM's entries of the same name, or is added, while load
	// balancers are on (e.g. HCLOUD_LOAD_BALANCERS_ENABLED=true).
	Env []EnvVar `json:"env,omitempty"`
	// CloudConfig names the settings of the CCM's cloud-config file
	// (ccm.cloudConfig) its service controller reads, as Section.key (or key,
	// for a file without sections): the operator sets them in that file of
	// the credentials Secret. Listed in docs/load-balancers.md.
	CloudConfig []string `json:"cloudConfig,omitempty"`
	// Notes say what else the CCM needs for load balancers (env for the
	// location, annotations), for the docs.
	Notes string `json:"notes,omitempty"`
	// Unsupported, when set, says why this CCM cannot serve load balancers.
	Unsupported string `json:"unsupported,omitempty"`
}

// Supports reports whether the profile can serve load balancers, and why not.
func (p *Profile) Supports() (bool, string) {
	switch {
	case p.LoadBalancers == nil:
		return false, "profile " + p.Name + " says nothing about load balancers (no loadBalancers section)"
	case p.LoadBalancers.Unsupported != "":
		return false, "profile " + p.Name + ": " + p.LoadBalancers.Unsupported
	}
	return true, ""
}

// Quirk is a known upstream behaviour and its mitigation.
type Quirk struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Mitigation  string `json:"mitigation"`
}

// EnforcedFlags are the CCM flags the coordinator always sets itself. Profiles
// and overrides must not set them; the post-renderer replaces them in every chart.
var EnforcedFlags = []string{
	"--controllers",
	"--use-service-account-credentials",
	"--leader-elect",
	"--leader-elect-resource-name",
	"--leader-elect-resource-namespace",
	"--leader-elect-resource-lock",
	"--leader-elect-lease-duration",
	"--leader-elect-renew-deadline",
	"--leader-elect-retry-period",
	"--secure-port",
	"--bind-address",
	"--cloud-provider",
	"--kubeconfig",
	"--authentication-kubeconfig",
	"--authorization-kubeconfig",
}

// SecretKeys returns every key the credentials Secret must contain.
func (p *Profile) SecretKeys() []string {
	var keys []string
	seen := map[string]bool{}
	add := func(k string) {
		if k != "" && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	for _, e := range p.Credentials.Env {
		if !e.Optional {
			add(e.Key)
		}
	}
	for _, k := range p.Credentials.RequiredKeys {
		add(k)
	}
	if p.CCM.CloudConfig != nil {
		add(p.CCM.CloudConfig.Key)
	}
	return keys
}

// NeedsSecret is true when the CCM reads a credentials Secret.
func (p *Profile) NeedsSecret() bool { return !p.Credentials.None }

// Routes reports whether the profile routes the platform name.
func (p *Profile) Routes(platform string) bool {
	for _, x := range p.Platforms {
		if x == platform {
			return true
		}
	}
	return false
}
