// Command ccm-coordinator installs each platform's native cloud-controller-manager
// in lifecycle-only mode, with Helm, for the platforms that have nodes.
//
// main is wiring only: the flags, their checks and what they configure are in
// coordinator/options, the work in the rest of coordinator/.
package main

import (
	goflag "flag"
	"fmt"
	"os"

	"github.com/fluxcd/pkg/runtime/client"
	runtimectrl "github.com/fluxcd/pkg/runtime/controller"
	"github.com/fluxcd/pkg/runtime/events"
	"github.com/fluxcd/pkg/runtime/logger"
	"github.com/fluxcd/pkg/runtime/metrics"
	"github.com/fluxcd/pkg/runtime/probes"
	flag "github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/internal/version"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/options"
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
	opts := options.New(defaultGateImage)
	opts.BindFlags(flag.CommandLine)
	// --kubeconfig (registered by controller-runtime on the Go flag set; without
	// it: $KUBECONFIG, in-cluster, ~/.kube/config)
	flag.CommandLine.AddGoFlagSet(goflag.CommandLine)
	flag.Parse()
	if opts.Version {
		fmt.Println(version.Line("ccm-coordinator"))
		return
	}

	log := logger.NewLogger(opts.Log)
	ctrl.SetLogger(log)
	if err := opts.Validate(); err != nil {
		log.Error(err, "invalid flags")
		os.Exit(1)
	}
	cfg, err := opts.Config(chartVersion())
	if err != nil {
		log.Error(err, "invalid profiles")
		os.Exit(1)
	}
	if opts.ListProfiles {
		for _, n := range cfg.Profiles.Names() {
			fmt.Printf("%s\t%s\n", n, cfg.Profiles.File(n))
		}
		return
	}

	restConfig := client.GetConfigOrDie(cfg.Client)
	mgr, err := ctrl.NewManager(restConfig, cfg.Manager)
	if err != nil {
		log.Error(err, "unable to create manager")
		os.Exit(1)
	}
	probes.SetupChecks(mgr, log)

	recorder := metrics.NewRecorder()
	crmetrics.Registry.MustRegister(recorder.Collectors()...)
	eventRecorder, err := events.NewRecorder(log, cfg.EventsAddr, names.CoordinatorController, events.WithManager(mgr))
	if err != nil {
		log.Error(err, "unable to create event recorder")
		os.Exit(1)
	}

	ctx := ctrl.SetupSignalHandler()
	helmOpts := cfg.Helm
	helmOpts.Log = log.WithName("helm")
	// The gate: every release gets the ccm-gate sidecar (the view) and an
	// admission policy (the fence). There is deliberately no switch to turn
	// it off: an ungated native CCM deletes other platforms' nodes.
	gateHook := cfg.Gate
	gateHook.Client, gateHook.Reader = mgr.GetClient(), mgr.GetAPIReader()
	r := &controller.NativeCCMReconciler{
		Client:        mgr.GetClient(),
		APIReader:     mgr.GetAPIReader(),
		EventRecorder: eventRecorder,
		Metrics:       runtimectrl.NewMetrics(mgr, recorder, v1.Finalizer),
		Engine:        helm.NewEngine(restConfig, helmOpts),
		Mutators:      gateHook.Mutators,
	}
	cfg.ApplyTo(r)
	if err := r.SetupWithManager(ctx, mgr, cfg.Controller); err != nil {
		log.Error(err, "unable to set up the NativeCCM controller")
		os.Exit(1)
	}

	log.Info("starting ccm-coordinator", "releaseNamespace", r.Namespace, "profiles", cfg.Profiles.Names())
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}
