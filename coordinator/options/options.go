// Package options holds the ccm-coordinator command's flags: their values
// (Options, with the defaults New gives), their registration on a flag set
// (BindFlags), their validation (Validate: every bad value at once, each
// naming its flag) and what the command runs with once they are checked
// (Config). cmd/ccm-coordinator parses the flags and wires what Config
// returns into a controller manager; this package starts nothing.
//
// The Flux runtime option groups (logger, leader election, client, rate
// limiter) are bound as github.com/fluxcd/pkg/runtime defines them: their
// flags, defaults and help are that library's. So are the NativeCCM health
// flags of coordinator/controller (HealthOptions).
package options

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fluxcd/pkg/runtime/client"
	runtimectrl "github.com/fluxcd/pkg/runtime/controller"
	"github.com/fluxcd/pkg/runtime/leaderelection"
	"github.com/fluxcd/pkg/runtime/logger"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientleaderelection "k8s.io/client-go/tools/leaderelection"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// Flag names. Those of the Flux groups and HealthOptions are those packages'
// own, spelled here only to name them in errors (TestValidate checks that
// every error names a registered flag).
const (
	flagMetricsAddr          = "metrics-addr"
	flagHealthAddr           = "health-addr"
	flagPprofAddr            = "pprof-addr"
	flagEventsAddr           = "events-addr"
	flagReleaseNamespace     = "release-namespace"
	flagProfileOverrides     = "profile-overrides"
	flagUninstallGracePeriod = "uninstall-grace-period"
	flagInterval             = "interval"
	flagWaitInterval         = "wait-interval"
	flagHelmWait             = "helm-wait"
	flagHelmTimeout          = "helm-timeout"
	flagConcurrent           = "concurrent"
	flagListProfiles         = "list-profiles"
	flagGateImage            = "gate-image"
	flagGateImagePullPolicy  = "gate-image-pull-policy"
	flagImagePullSecrets     = "image-pull-secrets"
	flagVersion              = "version"
	flagDomainLabels         = "domain-labels"
	flagNetworkPolicy        = "native-ccm-network-policy"
	flagAPIServerCIDRs       = "native-ccm-api-server-cidrs"
	flagAPIServerPorts       = "native-ccm-api-server-ports"
	flagCloudAPICIDRs        = "native-ccm-cloud-api-cidrs"
	flagCloudAPIPorts        = "native-ccm-cloud-api-ports"

	// github.com/fluxcd/pkg/runtime's
	flagLogEncoding   = "log-encoding"
	flagLogLevel      = "log-level"
	flagLeaseDuration = "leader-election-lease-duration"
	flagRenewDeadline = "leader-election-renew-deadline"
	flagRetryPeriod   = "leader-election-retry-period"
	flagMinRetryDelay = "min-retry-delay"
	flagMaxRetryDelay = "max-retry-delay"
	// coordinator/controller.HealthOptions'
	flagCCMLeaseDuration     = "ccm-lease-duration"
	flagCCMCrashLoopRestarts = "ccm-crash-loop-restarts"
)

// Defaults of the coordinator's own flags (docs/coordinator.md, "Flags"; the
// ccm-coordinator chart's values are the same).
const (
	DefaultMetricsAddr          = ":8080"
	DefaultHealthAddr           = ":9440"
	DefaultReleaseNamespace     = "hybrid-ccm-system"
	DefaultUninstallGracePeriod = 10 * time.Minute
	DefaultInterval             = 10 * time.Minute
	DefaultWaitInterval         = 30 * time.Second
	DefaultHelmTimeout          = 5 * time.Minute
	DefaultConcurrent           = 4
	DefaultAPIServerPort        = 6443
	DefaultCloudAPIPort         = 443
)

// anywhere is the default of both --native-ccm-*-cidrs flags.
var anywhere = []string{"0.0.0.0/0", "::/0"}

// Options are the ccm-coordinator's command-line flags, one field each.
type Options struct {
	// The Flux runtime groups, and the native CCM health flags.
	Log            logger.Options
	LeaderElection leaderelection.Options
	Client         client.Options
	RateLimiter    runtimectrl.RateLimiterOptions
	Health         controller.HealthOptions

	// MetricsAddr, HealthAddr and PprofAddr are what the metrics, health
	// and pprof listeners bind to (controller-runtime's: "0" is off for
	// each, "" off for health and pprof).
	MetricsAddr string
	HealthAddr  string
	PprofAddr   string
	// EventsAddr is the URL of a Flux notification-controller events
	// receiver; empty: none.
	EventsAddr string
	// ReleaseNamespace is the coordinator's own namespace.
	ReleaseNamespace string
	// ProfileOverrides is a directory of profile override files; empty:
	// the built-in profiles only.
	ProfileOverrides     string
	UninstallGracePeriod time.Duration
	Interval             time.Duration
	WaitInterval         time.Duration
	HelmWait             bool
	HelmTimeout          time.Duration
	Concurrent           int
	// ListProfiles and Version ask for a print and exit.
	ListProfiles bool
	Version      bool
	// GateImage and GateImagePullPolicy are the ccm-gate sidecar's.
	GateImage           string
	GateImagePullPolicy string
	ImagePullSecrets    []string
	// DomainLabels are the domain label keys beyond domain.BuiltinKeys.
	DomainLabels []string
	// NetworkPolicy turns on a NetworkPolicy per native CCM; the CIDRs and
	// ports are what it lets out.
	NetworkPolicy  bool
	APIServerCIDRs []string
	APIServerPorts []int32
	CloudAPICIDRs  []string
	CloudAPIPorts  []int32
}

// New returns the options with their defaults; gateImage is the
// --gate-image default (the ccm-gate image built beside the binary). The Flux
// groups' and HealthOptions' defaults are set by BindFlags, as those packages
// do.
func New(gateImage string) *Options {
	return &Options{
		MetricsAddr:          DefaultMetricsAddr,
		HealthAddr:           DefaultHealthAddr,
		ReleaseNamespace:     DefaultReleaseNamespace,
		UninstallGracePeriod: DefaultUninstallGracePeriod,
		Interval:             DefaultInterval,
		WaitInterval:         DefaultWaitInterval,
		HelmWait:             true,
		HelmTimeout:          DefaultHelmTimeout,
		Concurrent:           DefaultConcurrent,
		GateImage:            gateImage,
		APIServerCIDRs:       slices.Clone(anywhere),
		APIServerPorts:       []int32{DefaultAPIServerPort},
		CloudAPICIDRs:        slices.Clone(anywhere),
		CloudAPIPorts:        []int32{DefaultCloudAPIPort},
	}
}

// BindFlags registers every option on fs, with o's values as the defaults
// (those of the Flux groups and HealthOptions: theirs).
func (o *Options) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.MetricsAddr, flagMetricsAddr, o.MetricsAddr, "The address the metrics endpoint binds to.")
	fs.StringVar(&o.HealthAddr, flagHealthAddr, o.HealthAddr, "The address the health endpoint binds to.")
	fs.StringVar(&o.PprofAddr, flagPprofAddr, o.PprofAddr, "The address net/http/pprof is served on, unauthenticated (e.g. 127.0.0.1:6060, then kubectl port-forward); empty: not served.")
	fs.StringVar(&o.EventsAddr, flagEventsAddr, o.EventsAddr, "The address of an events receiver (Flux notification-controller), optional.")
	fs.StringVar(&o.ReleaseNamespace, flagReleaseNamespace, o.ReleaseNamespace, "The coordinator's own namespace: the native CCM releases, their Helm history, credentials Secrets and leases (never a namespace other workloads share).")
	fs.StringVar(&o.ProfileOverrides, flagProfileOverrides, o.ProfileOverrides, "Directory of profile override files (*.yaml), merged over the built-in profiles.")
	fs.DurationVar(&o.UninstallGracePeriod, flagUninstallGracePeriod, o.UninstallGracePeriod, "How long install policy Auto keeps a release after the last node of its platform is gone.")
	fs.DurationVar(&o.Interval, flagInterval, o.Interval, "How often a Ready NativeCCM is checked again (drift, conflicts).")
	fs.DurationVar(&o.WaitInterval, flagWaitInterval, o.WaitInterval, "How often a waiting NativeCCM (credentials missing) is checked again.")
	fs.BoolVar(&o.HelmWait, flagHelmWait, o.HelmWait, "Wait for native CCM workloads to become ready after install, upgrade and rollback.")
	fs.DurationVar(&o.HelmTimeout, flagHelmTimeout, o.HelmTimeout, "Timeout of each Helm action.")
	fs.IntVar(&o.Concurrent, flagConcurrent, o.Concurrent, "The number of NativeCCMs reconciled at the same time.")
	fs.BoolVar(&o.ListProfiles, flagListProfiles, o.ListProfiles, "Print the resolved profile names and exit.")
	fs.StringVar(&o.GateImage, flagGateImage, o.GateImage, "Image of the ccm-gate sidecar added to every native CCM.")
	fs.StringVar(&o.GateImagePullPolicy, flagGateImagePullPolicy, o.GateImagePullPolicy, "Pull policy of the ccm-gate image (default: Kubernetes' default).")
	fs.StringSliceVar(&o.ImagePullSecrets, flagImagePullSecrets, o.ImagePullSecrets, "Secrets in the release namespace (comma-separated names) every native CCM pod pulls its images with, the ccm-gate image included; the coordinator waits while one is missing.")
	fs.BoolVar(&o.Version, flagVersion, o.Version, "Print the version and exit.")
	fs.StringSliceVar(&o.DomainLabels, flagDomainLabels, o.DomainLabels, "Node labels a NativeCCM's domain may restrict besides the built-in node.cloudprovider.kubernetes.io/domain and topology.kubernetes.io/region (comma-separated; the chart passes gate.domainLabels, which its fence checks too).")
	fs.BoolVar(&o.NetworkPolicy, flagNetworkPolicy, o.NetworkPolicy, "Give every native CCM a NetworkPolicy: nothing in; out only DNS (port 53), the API server and the cloud APIs (the flags below). No effect on native CCMs in the host network, nor where the CNI does not enforce network policies.")
	fs.StringSliceVar(&o.APIServerCIDRs, flagAPIServerCIDRs, o.APIServerCIDRs, "With --native-ccm-network-policy: the API server's addresses (its endpoints, kubectl get endpointslices -l kubernetes.io/service-name=kubernetes), as CIDRs.")
	fs.Int32SliceVar(&o.APIServerPorts, flagAPIServerPorts, o.APIServerPorts, "With --native-ccm-network-policy: the API server's TCP ports (its endpoints', not the kubernetes Service's).")
	fs.StringSliceVar(&o.CloudAPICIDRs, flagCloudAPICIDRs, o.CloudAPICIDRs, "With --native-ccm-network-policy: the cloud APIs' addresses, as CIDRs (default: anywhere; a cloud's API endpoints are its own to know).")
	fs.Int32SliceVar(&o.CloudAPIPorts, flagCloudAPIPorts, o.CloudAPIPorts, "With --native-ccm-network-policy: the cloud APIs' TCP ports.")
	o.Log.BindFlags(fs)
	o.LeaderElection.BindFlags(fs)
	o.Client.BindFlags(fs)
	o.RateLimiter.BindFlags(fs)
	o.Health.BindFlags(fs)
}

// flagPath names a flag in a validation error.
func flagPath(name string) *field.Path { return field.NewPath("--" + name) }

// pullPolicies are the values of --gate-image-pull-policy besides "".
var pullPolicies = []string{string(corev1.PullAlways), string(corev1.PullIfNotPresent), string(corev1.PullNever)}

// Validate reports every option whose value the coordinator cannot run with,
// each error naming its flag and the value (nil when all are valid), as an
// aggregate of *field.Error. o is expected bound (BindFlags) and parsed. Values
// that mean something today keep their meaning: zero durations and counts
// where the library takes zero as its default, and the --native-ccm-*
// destinations are checked only with --native-ccm-network-policy, the only
// time they are used.
func (o *Options) Validate() error {
	var errs field.ErrorList
	errs = append(errs, validateListenAddress(flagPath(flagMetricsAddr), o.MetricsAddr)...)
	errs = append(errs, validateListenAddress(flagPath(flagHealthAddr), o.HealthAddr)...)
	errs = append(errs, validateListenAddress(flagPath(flagPprofAddr), o.PprofAddr)...)
	if o.EventsAddr != "" {
		if u, err := url.Parse(o.EventsAddr); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, field.Invalid(flagPath(flagEventsAddr), o.EventsAddr, "not an http:// or https:// URL"))
		}
	}

	if fp := flagPath(flagReleaseNamespace); o.ReleaseNamespace == "" {
		errs = append(errs, field.Required(fp, "the coordinator's own namespace"))
	} else {
		for _, msg := range validation.IsDNS1123Label(o.ReleaseNamespace) {
			errs = append(errs, field.Invalid(fp, o.ReleaseNamespace, "not a namespace name: "+msg))
		}
	}
	if o.ProfileOverrides != "" {
		fp := flagPath(flagProfileOverrides)
		if fi, err := os.Stat(o.ProfileOverrides); err != nil {
			errs = append(errs, field.Invalid(fp, o.ProfileOverrides, err.Error()))
		} else if !fi.IsDir() {
			errs = append(errs, field.Invalid(fp, o.ProfileOverrides, "not a directory"))
		}
	}

	for _, d := range []struct {
		name  string
		value time.Duration
	}{
		{flagUninstallGracePeriod, o.UninstallGracePeriod},
		{flagInterval, o.Interval},
		{flagWaitInterval, o.WaitInterval},
		{flagHelmTimeout, o.HelmTimeout},
		{flagCCMLeaseDuration, o.Health.LeaseDuration},
		{flagMinRetryDelay, o.RateLimiter.MinRetryDelay},
		{flagMaxRetryDelay, o.RateLimiter.MaxRetryDelay},
	} {
		if d.value < 0 {
			errs = append(errs, field.Invalid(flagPath(d.name), d.value.String(), "must not be negative"))
		}
	}
	if rl := o.RateLimiter; rl.MinRetryDelay > 0 && rl.MaxRetryDelay > 0 && rl.MinRetryDelay > rl.MaxRetryDelay {
		errs = append(errs, field.Invalid(flagPath(flagMinRetryDelay), rl.MinRetryDelay.String(),
			fmt.Sprintf("must not be longer than --%s (%s): the back-off would start above its ceiling", flagMaxRetryDelay, rl.MaxRetryDelay)))
	}
	if o.Concurrent < 1 {
		errs = append(errs, field.Invalid(flagPath(flagConcurrent), o.Concurrent, "must be at least 1"))
	}
	if o.Health.CrashLoopRestarts < 0 {
		errs = append(errs, field.Invalid(flagPath(flagCCMCrashLoopRestarts), o.Health.CrashLoopRestarts, "must not be negative"))
	}

	if strings.TrimSpace(o.GateImage) == "" {
		errs = append(errs, field.Required(flagPath(flagGateImage), "the ccm-gate image every native CCM runs beside it"))
	}
	if p := o.GateImagePullPolicy; p != "" && !slices.Contains(pullPolicies, p) {
		errs = append(errs, field.NotSupported(flagPath(flagGateImagePullPolicy), p, pullPolicies))
	}
	errs = append(errs, release.ValidateImagePullSecrets(flagPath(flagImagePullSecrets), o.ImagePullSecrets)...)
	for i, k := range o.DomainLabels {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(flagPath(flagDomainLabels).Index(i), k, "not a label key: "+msg))
		}
	}
	if o.NetworkPolicy {
		errs = append(errs, validateEgress(flagAPIServerCIDRs, flagAPIServerPorts, o.APIServerCIDRs, o.APIServerPorts)...)
		errs = append(errs, validateEgress(flagCloudAPICIDRs, flagCloudAPIPorts, o.CloudAPICIDRs, o.CloudAPIPorts)...)
	}

	errs = append(errs, o.validateFluxGroups()...)
	return errs.ToAggregate()
}

// validateFluxGroups checks the Flux runtime groups' values that library
// would otherwise take silently (an unknown log level or encoding: its
// default) or refuse only once the manager runs (leader-election timings, as
// client-go's leader elector checks them).
func (o *Options) validateFluxGroups() field.ErrorList {
	var errs field.ErrorList
	if levels := []string{"trace", "debug", "info", "error"}; !slices.Contains(levels, o.Log.LogLevel) {
		errs = append(errs, field.NotSupported(flagPath(flagLogLevel), o.Log.LogLevel, levels))
	}
	if encodings := []string{"json", "console"}; !slices.Contains(encodings, o.Log.LogEncoding) {
		errs = append(errs, field.NotSupported(flagPath(flagLogEncoding), o.Log.LogEncoding, encodings))
	}
	if le := o.LeaderElection; le.Enable {
		switch {
		case le.RetryPeriod <= 0:
			errs = append(errs, field.Invalid(flagPath(flagRetryPeriod), le.RetryPeriod.String(), "must be positive"))
		case le.RenewDeadline <= time.Duration(clientleaderelection.JitterFactor*float64(le.RetryPeriod)):
			errs = append(errs, field.Invalid(flagPath(flagRenewDeadline), le.RenewDeadline.String(),
				fmt.Sprintf("must be greater than %g × --%s (%s)", clientleaderelection.JitterFactor, flagRetryPeriod, le.RetryPeriod)))
		case le.LeaseDuration <= le.RenewDeadline:
			errs = append(errs, field.Invalid(flagPath(flagLeaseDuration), le.LeaseDuration.String(),
				fmt.Sprintf("must be greater than --%s (%s)", flagRenewDeadline, le.RenewDeadline)))
		}
	}
	return errs
}

// validateListenAddress checks what a listener binds to: host:port (an
// empty host: every address; a port number or name, empty or 0: any free
// port), or "" or "0", which controller-runtime takes as its default or off.
func validateListenAddress(fp *field.Path, addr string) field.ErrorList {
	if addr == "" || addr == "0" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return field.ErrorList{field.Invalid(fp, addr, "not host:port")}
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return field.ErrorList{field.Invalid(fp, addr, fmt.Sprintf("port %q is neither a port number nor a service name", port))}
	}
	if _, err := netip.ParseAddr(host); host != "" && err != nil && len(validation.IsDNS1123Subdomain(strings.ToLower(host))) > 0 {
		return field.ErrorList{field.Invalid(fp, addr, fmt.Sprintf("host %q is neither an IP address nor a DNS name", host))}
	}
	return nil
}

// validateEgress checks one destination of the native CCMs' NetworkPolicy:
// at least one CIDR and one port, each valid (gate.Egress.Validate's rules),
// each error naming its flag.
func validateEgress(cidrsFlag, portsFlag string, cidrs []string, ports []int32) field.ErrorList {
	var errs field.ErrorList
	if len(cidrs) == 0 {
		errs = append(errs, field.Required(flagPath(cidrsFlag), "at least one CIDR"))
	}
	for i, c := range cidrs {
		if !gate.ValidCIDR(c) {
			errs = append(errs, field.Invalid(flagPath(cidrsFlag).Index(i), c, "not a CIDR (address/bits, host bits zero)"))
		}
	}
	if len(ports) == 0 {
		errs = append(errs, field.Required(flagPath(portsFlag), "at least one port"))
	}
	for i, p := range ports {
		if !gate.ValidPort(p) {
			errs = append(errs, field.Invalid(flagPath(portsFlag).Index(i), p, "not a port (1-65535)"))
		}
	}
	return errs
}
