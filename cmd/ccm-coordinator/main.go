// Command ccm-coordinator installs each platform's native cloud-controller-manager
// in lifecycle-only mode, with Helm, for the platforms that have nodes.
//
// main holds flags and wiring only; the work is in coordinator/.
package main

import (
	goflag "flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/fluxcd/pkg/runtime/client"
	runtimectrl "github.com/fluxcd/pkg/runtime/controller"
	"github.com/fluxcd/pkg/runtime/events"
	"github.com/fluxcd/pkg/runtime/leaderelection"
	"github.com/fluxcd/pkg/runtime/logger"
	"github.com/fluxcd/pkg/runtime/metrics"
	"github.com/fluxcd/pkg/runtime/probes"
	flag "github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/internal/version"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/procmem"

	// Public root certificates for chart repositories and OCI registries
	// over HTTPS, used only where the system has none: the image holds the
	// binary alone.
	_ "golang.org/x/crypto/x509roots/fallback"
)

// defaultGateImage is the --gate-image default. Image builds (hack/ship) set
// it with -X to the ccm-gate image built beside this binary.
var defaultGateImage = "ghcr.io/hybrid-ccm/ccm-gate:0.1.0"

// chartVersion is the version the embedded native-ccm chart is installed at:
// the release's (set at link time), or the chart's own in a build that is
// not a release.
func chartVersion() string {
	if version.Released() {
		return version.Version
	}
	return ""
}

// defaultGCPercent keeps the heap's headroom above the caches small; the
// coordinator's work is a few reconciles a minute. GOGC overrides it.
const defaultGCPercent = 50

func main() {
	procmem.DefaultGCPercent(defaultGCPercent)
	var (
		logOpts      logger.Options
		leaderOpts   leaderelection.Options
		clientOpts   client.Options
		rateOpts     runtimectrl.RateLimiterOptions
		healthOpts   controller.HealthOptions
		metricsAddr  = flag.String("metrics-addr", ":8080", "The address the metrics endpoint binds to.")
		healthAddr   = flag.String("health-addr", ":9440", "The address the health endpoint binds to.")
		pprofAddr    = flag.String("pprof-addr", "", "The address net/http/pprof is served on, unauthenticated (e.g. 127.0.0.1:6060, then kubectl port-forward); empty: not served.")
		eventsAddr   = flag.String("events-addr", "", "The address of an events receiver (Flux notification-controller), optional.")
		namespace    = flag.String("release-namespace", "hybrid-ccm-system", "The coordinator's own namespace: the native CCM releases, their Helm history, credentials Secrets and leases (never a namespace other workloads share).")
		overrides    = flag.String("profile-overrides", "", "Directory of profile override files (*.yaml), merged over the built-in profiles.")
		grace        = flag.Duration("uninstall-grace-period", 10*time.Minute, "How long install policy Auto keeps a release after the last node of its platform is gone.")
		interval     = flag.Duration("interval", 10*time.Minute, "How often a Ready NativeCCM is checked again (drift, conflicts).")
		retry        = flag.Duration("wait-interval", 30*time.Second, "How often a waiting NativeCCM (credentials missing) is checked again.")
		helmWait     = flag.Bool("helm-wait", true, "Wait for native CCM workloads to become ready after install, upgrade and rollback.")
		helmTimeout  = flag.Duration("helm-timeout", 5*time.Minute, "Timeout of each Helm action.")
		concurrent   = flag.Int("concurrent", 4, "The number of NativeCCMs reconciled at the same time.")
		listProfiles = flag.Bool("list-profiles", false, "Print the resolved profile names and exit.")
		gateImage    = flag.String("gate-image", defaultGateImage, "Image of the ccm-gate sidecar added to every native CCM.")
		gatePull     = flag.String("gate-image-pull-policy", "", "Pull policy of the ccm-gate image (default: Kubernetes' default).")
		pullSecrets  = flag.StringSlice("image-pull-secrets", nil, "Secrets in the release namespace (comma-separated names) every native CCM pod pulls its images with, the ccm-gate image included; the coordinator waits while one is missing.")
		printVersion = flag.Bool("version", false, "Print the version and exit.")
		domainLabels = flag.StringSlice("domain-labels", nil, "Node labels a NativeCCM's domain may restrict besides the built-in node.cloudprovider.kubernetes.io/domain and topology.kubernetes.io/region (comma-separated; the chart passes gate.domainLabels, which its fence checks too).")
		netpol       = flag.Bool("native-ccm-network-policy", false, "Give every native CCM a NetworkPolicy: nothing in; out only DNS (port 53), the API server and the cloud APIs (the flags below). No effect on native CCMs in the host network, nor where the CNI does not enforce network policies.")
		npAPICIDRs   = flag.StringSlice("native-ccm-api-server-cidrs", []string{"0.0.0.0/0", "::/0"}, "With --native-ccm-network-policy: the API server's addresses (its endpoints, kubectl get endpointslices -l kubernetes.io/service-name=kubernetes), as CIDRs.")
		npAPIPorts   = flag.Int32Slice("native-ccm-api-server-ports", []int32{6443}, "With --native-ccm-network-policy: the API server's TCP ports (its endpoints', not the kubernetes Service's).")
		npCloudCIDRs = flag.StringSlice("native-ccm-cloud-api-cidrs", []string{"0.0.0.0/0", "::/0"}, "With --native-ccm-network-policy: the cloud APIs' addresses, as CIDRs (default: anywhere; a cloud's API endpoints are its own to know).")
		npCloudPorts = flag.Int32Slice("native-ccm-cloud-api-ports", []int32{443}, "With --native-ccm-network-policy: the cloud APIs' TCP ports.")
	)
	logOpts.BindFlags(flag.CommandLine)
	leaderOpts.BindFlags(flag.CommandLine)
	clientOpts.BindFlags(flag.CommandLine)
	rateOpts.BindFlags(flag.CommandLine)
	healthOpts.BindFlags(flag.CommandLine)
	// --kubeconfig (registered by controller-runtime on the Go flag set; without
	// it: $KUBECONFIG, in-cluster, ~/.kube/config)
	flag.CommandLine.AddGoFlagSet(goflag.CommandLine)
	flag.Parse()
	if *printVersion {
		fmt.Println(version.Line("ccm-coordinator"))
		return
	}

	log := logger.NewLogger(logOpts)
	ctrl.SetLogger(log)
	if errs := release.ValidateImagePullSecrets(field.NewPath("--image-pull-secrets"), *pullSecrets); len(errs) > 0 {
		log.Error(errs.ToAggregate(), "invalid flags")
		os.Exit(1)
	}

	var netpolConfig *gate.NetworkPolicyConfig
	if *netpol {
		netpolConfig = &gate.NetworkPolicyConfig{
			APIServer: gate.Egress{CIDRs: *npAPICIDRs, Ports: *npAPIPorts},
			CloudAPI:  gate.Egress{CIDRs: *npCloudCIDRs, Ports: *npCloudPorts},
		}
		if err := netpolConfig.Validate(); err != nil {
			log.Error(err, "invalid flags", "flag", "--native-ccm-*")
			os.Exit(1)
		}
	}

	profiles, err := profile.Builtin()
	if err == nil && *overrides != "" {
		err = profiles.OverrideDir(*overrides)
	}
	if err != nil {
		log.Error(err, "invalid profiles")
		os.Exit(1)
	}
	if *listProfiles {
		for _, n := range profiles.Names() {
			fmt.Printf("%s\t%s\n", n, profiles.File(n))
		}
		return
	}

	restConfig := client.GetConfigOrDie(clientOpts)
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                        controller.NewScheme(),
		Cache:                         controller.CacheOptions(*namespace),
		Metrics:                       metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:        *healthAddr,
		PprofBindAddress:              *pprofAddr,
		LeaderElection:                leaderOpts.Enable,
		LeaderElectionReleaseOnCancel: leaderOpts.ReleaseOnCancel,
		LeaseDuration:                 &leaderOpts.LeaseDuration,
		RenewDeadline:                 &leaderOpts.RenewDeadline,
		RetryPeriod:                   &leaderOpts.RetryPeriod,
		LeaderElectionID:              names.CoordinatorLease,
		LeaderElectionNamespace:       *namespace,
	})
	if err != nil {
		log.Error(err, "unable to create manager")
		os.Exit(1)
	}
	probes.SetupChecks(mgr, log)

	recorder := metrics.NewRecorder()
	crmetrics.Registry.MustRegister(recorder.Collectors()...)
	eventRecorder, err := events.NewRecorder(log, *eventsAddr, names.CoordinatorController, events.WithManager(mgr))
	if err != nil {
		log.Error(err, "unable to create event recorder")
		os.Exit(1)
	}

	ctx := ctrl.SetupSignalHandler()
	r := &controller.NativeCCMReconciler{
		Client:        mgr.GetClient(),
		APIReader:     mgr.GetAPIReader(),
		EventRecorder: eventRecorder,
		Metrics:       runtimectrl.NewMetrics(mgr, recorder, v1.Finalizer),
		Engine: helm.NewEngine(restConfig, helm.Options{
			Wait: *helmWait, Timeout: *helmTimeout, Log: log.WithName("helm"),
			BuiltinChartVersion: chartVersion(),
		}),
		Profiles: profiles,
		// The gate: every release gets the ccm-gate sidecar (the view) and an
		// admission policy (the fence). There is deliberately no switch to turn
		// it off: an ungated native CCM deletes other platforms' nodes.
		Mutators: gate.Coordinator{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Image: *gateImage,
			ImagePullPolicy: corev1.PullPolicy(*gatePull), NetworkPolicy: netpolConfig}.Mutators,
		Namespace:            *namespace,
		DomainLabels:         append(slices.Clone(domain.BuiltinKeys), *domainLabels...),
		ImagePullSecrets:     *pullSecrets,
		UninstallGracePeriod: *grace,
		RetryInterval:        *retry,
		Interval:             *interval,
		Health:               healthOpts,
	}
	if err := r.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: *concurrent, RateLimiter: rateOpts}); err != nil {
		log.Error(err, "unable to set up the NativeCCM controller")
		os.Exit(1)
	}

	log.Info("starting ccm-coordinator", "releaseNamespace", *namespace, "profiles", profiles.Names())
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}
