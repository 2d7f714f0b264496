package options

import (
	"slices"
	"time"

	"github.com/fluxcd/pkg/runtime/client"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
)

// Config is what the coordinator runs with, made from valid Options: the
// parts the command wires together, each in the type its user takes.
type Config struct {
	// Profiles are the built-in profiles with --profile-overrides merged
	// over them.
	Profiles *profile.Set
	// Client are the API client's rate limits (client.GetConfigOrDie).
	Client client.Options
	// Manager are the controller manager's options: its scheme and cache
	// (the release namespace's objects), listeners and leader election
	// (the coordinator's Lease in the release namespace).
	Manager ctrl.Options
	// Controller are the NativeCCM controller's concurrency and retries.
	Controller controller.Options
	// EventsAddr is the Flux events receiver's URL, or empty.
	EventsAddr string
	// Helm are the release engine's options; Log is the caller's to set.
	Helm helm.Options
	// Gate is the gate's hook of every release (its Mutators method); Client
	// and Reader are the caller's to set, from the manager.
	Gate gate.Coordinator

	// the NativeCCMReconciler's settings (ApplyTo)
	namespace            string
	imagePullSecrets     []string
	domainLabels         []string
	uninstallGracePeriod time.Duration
	retryInterval        time.Duration
	interval             time.Duration
	health               controller.HealthOptions
}

// Config loads the profiles and assembles the configuration of valid
// options (Validate); builtinChartVersion is the version the embedded
// native-ccm chart is installed at (empty: the chart's own). Its error is the
// profiles'.
func (o *Options) Config(builtinChartVersion string) (*Config, error) {
	profiles, err := profile.Builtin()
	if err == nil && o.ProfileOverrides != "" {
		err = profiles.OverrideDir(o.ProfileOverrides)
	}
	if err != nil {
		return nil, err
	}
	var netpol *gate.NetworkPolicyConfig
	if o.NetworkPolicy {
		netpol = &gate.NetworkPolicyConfig{
			APIServer: gate.Egress{CIDRs: o.APIServerCIDRs, Ports: o.APIServerPorts},
			CloudAPI:  gate.Egress{CIDRs: o.CloudAPICIDRs, Ports: o.CloudAPIPorts},
		}
	}
	le := o.LeaderElection
	return &Config{
		Profiles: profiles,
		Client:   o.Client,
		Manager: ctrl.Options{
			Scheme:                        controller.NewScheme(),
			Cache:                         controller.CacheOptions(o.ReleaseNamespace),
			Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
			HealthProbeBindAddress:        o.HealthAddr,
			PprofBindAddress:              o.PprofAddr,
			LeaderElection:                le.Enable,
			LeaderElectionReleaseOnCancel: le.ReleaseOnCancel,
			LeaseDuration:                 &le.LeaseDuration,
			RenewDeadline:                 &le.RenewDeadline,
			RetryPeriod:                   &le.RetryPeriod,
			LeaderElectionID:              names.CoordinatorLease,
			LeaderElectionNamespace:       o.ReleaseNamespace,
		},
		Controller: controller.Options{MaxConcurrentReconciles: o.Concurrent, RateLimiter: o.RateLimiter},
		EventsAddr: o.EventsAddr,
		Helm:       helm.Options{Wait: o.HelmWait, Timeout: o.HelmTimeout, BuiltinChartVersion: builtinChartVersion},
		Gate: gate.Coordinator{Image: o.GateImage, ImagePullPolicy: corev1.PullPolicy(o.GateImagePullPolicy),
			NetworkPolicy: netpol},

		namespace:            o.ReleaseNamespace,
		imagePullSecrets:     o.ImagePullSecrets,
		domainLabels:         append(slices.Clone(domain.BuiltinKeys), o.DomainLabels...),
		uninstallGracePeriod: o.UninstallGracePeriod,
		retryInterval:        o.WaitInterval,
		interval:             o.Interval,
		health:               o.Health,
	}, nil
}

// ApplyTo sets the reconciler's settings that come from the flags: its
// profiles, namespace, image pull Secrets, domain labels, intervals and
// health options. Its clients, engine and hooks are the caller's.
func (c *Config) ApplyTo(r *controller.NativeCCMReconciler) {
	r.Profiles = c.Profiles
	r.Namespace = c.namespace
	r.ImagePullSecrets = c.imagePullSecrets
	r.DomainLabels = c.domainLabels
	r.UninstallGracePeriod = c.uninstallGracePeriod
	r.RetryInterval = c.retryInterval
	r.Interval = c.interval
	r.Health = c.health
}
