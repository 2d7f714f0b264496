// Package app assembles the talos-ccm command on k8s.io/cloud-provider/app:
// the "talos" cloud provider, the controllers talos-ccm runs (cloud-node,
// node-csr-approval, node-ipam-controller) and their flags, with defaults that
// suit a hybrid cluster (own leader-election lease, sane client rate limits,
// concurrent node syncs). It owns no controller logic.
package app

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	cloudprovider "k8s.io/cloud-provider"
	cpapp "k8s.io/cloud-provider/app"
	cloudcontrollerconfig "k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/options"
	cliflag "k8s.io/component-base/cli/flag"
	genericcontrollermanager "k8s.io/controller-manager/app"
	"k8s.io/controller-manager/controller"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloudnode"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/events"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/ipam"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/iplist"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/reach"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Defaults a user gets (the chart uses the same).
const (
	DefaultLeaseName           = "talos-ccm"
	DefaultQPS                 = 1000
	DefaultBurst               = 2000
	DefaultConcurrentNodeSyncs = 32
)

// talosFlags are talos-ccm's own flags beyond the cloud-provider framework's.
type talosFlags struct {
	talosconfig  string
	talosContext string
	endpoints    []string
	timeout      time.Duration
	lookup       time.Duration
	enforce      bool
	initEvents   bool
}

func (f *talosFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.talosconfig, "talosconfig", os.Getenv("TALOSCONFIG"),
		"Talos client configuration file (default: $TALOSCONFIG, ~/.talos/config, /var/run/secrets/talos.dev/config).")
	fs.StringVar(&f.talosContext, "talos-context", "", "talosconfig context to use (default: the current one).")
	fs.StringSliceVar(&f.endpoints, "talos-endpoints", nil, "Talos API endpoints overriding those of the talosconfig (and global.endpoints of --cloud-config).")
	fs.DurationVar(&f.timeout, "talos-timeout", 10*time.Second, "Timeout of each Talos API request.")
	fs.DurationVar(&f.lookup, "talos-lookup-timeout", 0,
		"Deadline of one lookup of a node's facts as a whole (every address tried, every request); one lookup per node is in flight, shared by all controllers (default: twice --talos-timeout).")
	fs.BoolVar(&f.initEvents, "node-initialized-events", false,
		"Record a Normal event on every node initialized (one more API write per node; warnings are always recorded).")
	fs.BoolVar(&f.enforce, "enforce-transformations", false,
		"Keep transformation output reconciled on initialized nodes and remove keys a rule no longer produces (also settable as global.enforce in --cloud-config).")
}

// NewCommand returns the talos-ccm command.
func NewCommand(stopCh <-chan struct{}) (*cobra.Command, error) {
	s, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		return nil, err
	}
	s.KubeCloudShared.CloudProvider.Name = names.ProviderName
	s.Generic.LeaderElection.ResourceName = DefaultLeaseName
	s.Generic.ClientConnection.QPS = DefaultQPS
	s.Generic.ClientConnection.Burst = DefaultBurst
	s.NodeController.ConcurrentNodeSyncs = DefaultConcurrentNodeSyncs
	// talos-ccm does not route: no --configure-cloud-routes by default
	s.KubeCloudShared.ConfigureCloudRoutes = false

	tf := &talosFlags{}
	var fss cliflag.NamedFlagSets
	tf.addFlags(fss.FlagSet("talos"))
	csrOpts := csr.NewOptions()
	csrOpts.AddFlags(fss.FlagSet("node-csr-approval"))

	// Set in RunE, once the configuration is checked: the one facts source
	// every controller learns about nodes from, and the provider answering
	// k8s.io/cloud-provider from it.
	var (
		nodeFacts *facts.Source
		provider  *cloud.Provider
		rules     = &transform.Config{}
	)
	recorders := &sharedRecorder{}
	// nodes whose Talos API cannot be reached: events and metrics, whichever
	// controller's lookup found it (each sets the recorder; the first stays)
	reachability := reach.New(reach.Options{})
	lease := &leaseReader{}
	initCloud := func(c *cloudcontrollerconfig.CompletedConfig) cloudprovider.Interface {
		return provider
	}

	// nodeControllers is what every controller of talos-ccm that reads nodes
	// needs of the process, whichever of them --controllers runs: the slim
	// node cache, the leader Lease reader, unreachable nodes' events, and the
	// facts source forgetting deleted nodes. Each part is set up once however
	// many controllers call it.
	nodeControllers := func(ctx context.Context, cc *cloudcontrollerconfig.CompletedConfig, client kubernetes.Interface) error {
		slimNodeCache(cc)
		lease.start(ctx, cc)
		reachability.SetRecorder(recorders.recorder(ctx, client, reach.Component))
		return nodeFacts.ForgetDeleted(cc.SharedInformers.Core().V1().Nodes().Informer())
	}

	constructors := map[string]cpapp.ControllerInitFuncConstructor{
		names.CloudNodeController: {
			InitContext: cpapp.ControllerInitContext{ClientName: "node-controller"},
			Constructor: func(ic cpapp.ControllerInitContext, cc *cloudcontrollerconfig.CompletedConfig, _ cloudprovider.Interface) cpapp.InitFunc {
				return func(ctx context.Context, _ genericcontrollermanager.ControllerContext) (controller.Interface, bool, error) {
					client := cc.ClientBuilder.ClientOrDie(ic.ClientName)
					if err := nodeControllers(ctx, cc, client); err != nil {
						return nil, false, err
					}
					c, err := cloudnode.New(client, cc.SharedInformers.Core().V1().Nodes(), nodeFacts,
						recorders.recorder(ctx, client, names.CloudNodeController), cloudnode.Options{
							Workers:               int(cc.ComponentConfig.NodeController.ConcurrentNodeSyncs),
							StatusUpdateFrequency: cc.ComponentConfig.NodeStatusUpdateFrequency.Duration,
							Enforce:               tf.enforce || rules.Global.Enforce,
							InitializedEvents:     tf.initEvents,
						})
					if err != nil {
						return nil, false, err
					}
					go c.Run(ctx)
					return nil, true, nil
				}
			},
		},
	}
	constructors[names.CSRApprovalController] = cpapp.ControllerInitFuncConstructor{
		InitContext: cpapp.ControllerInitContext{ClientName: "node-csr-approval"},
		Constructor: func(ic cpapp.ControllerInitContext, cc *cloudcontrollerconfig.CompletedConfig, _ cloudprovider.Interface) cpapp.InitFunc {
			return func(ctx context.Context, _ genericcontrollermanager.ControllerContext) (controller.Interface, bool, error) {
				client := cc.ClientBuilder.ClientOrDie(ic.ClientName)
				if err := nodeControllers(ctx, cc, client); err != nil {
					return nil, false, err
				}
				opts := *csrOpts
				// the host talos-ccm reaches the API server at, and the pod CIDR,
				// are never a node's
				opts.APIServer = cc.Kubeconfig.Host
				if cidrs, err := iplist.Prefixes(cc.ComponentConfig.KubeCloudShared.ClusterCIDR); err == nil {
					opts.ReservedIPRanges = append(slices.Clone(opts.ReservedIPRanges), cidrs...)
				}
				c, err := csr.NewController(client, cc.SharedInformers.Certificates().V1().CertificateSigningRequests(),
					cc.SharedInformers.Core().V1().Nodes(), nodeFacts, recorders.recorder(ctx, client, names.CSRApprovalController), &opts)
				if err != nil {
					return nil, false, err
				}
				go c.Run(ctx)
				return nil, true, nil
			}
		},
	}

	// --- node-ipam-controller (ccm/ipam) -------------------------------------
	// Registered like the others (--controllers); does nothing unless
	// --allocate-node-cidrs. talosClient is set in RunE.
	ipamOpts := ipam.NewOptions()
	ipamOpts.AddFlags(fss.FlagSet("node-ipam-controller"))
	var talosClient *talos.Client
	constructors[names.IPAMController] = cpapp.ControllerInitFuncConstructor{
		InitContext: cpapp.ControllerInitContext{ClientName: "node-ipam-controller"},
		Constructor: func(ic cpapp.ControllerInitContext, cc *cloudcontrollerconfig.CompletedConfig, _ cloudprovider.Interface) cpapp.InitFunc {
			return func(ctx context.Context, _ genericcontrollermanager.ControllerContext) (controller.Interface, bool, error) {
				shared := cc.ComponentConfig.KubeCloudShared
				if !shared.AllocateNodeCIDRs {
					return nil, false, nil
				}
				cfg, err := ipamOpts.Config(shared.CIDRAllocatorType, shared.ClusterCIDR)
				if err != nil {
					return nil, false, err
				}
				client := cc.ClientBuilder.ClientOrDie(ic.ClientName)
				if err := nodeControllers(ctx, cc, client); err != nil {
					return nil, false, err
				}
				c, err := ipam.NewController(client, cc.SharedInformers.Core().V1().Nodes(), nodeFacts, talosClient, recorders.recorder(ctx, client, names.IPAMController), cfg)
				if err != nil {
					return nil, false, err
				}
				go c.Run(ctx)
				return nil, true, nil
			}
		},
	}
	// --- end node-ipam-controller --------------------------------------------

	cmd := cpapp.NewCloudControllerManagerCommand(s, initCloud, constructors, names.ControllerAliases(), fss, stopCh)
	cmd.Use = "talos-ccm"
	cmd.Long = "talos-ccm initializes Talos nodes from their Talos API (providerID, topology labels, addresses,\n" +
		"the routing label node.cloudprovider.kubernetes.io/platform, transformation rules), allocates\n" +
		"pod CIDRs and approves kubelet serving certificates. Native cloud CCMs run lifecycle-only beside it."
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// Everything the user configured is checked before any controller starts:
		// a bad rules file or talosconfig is a clear error and a non-zero exit.
		if path := s.KubeCloudShared.CloudProvider.CloudConfigFile; path != "" {
			if rules, err = transform.Load(path); err != nil {
				return fmt.Errorf("--cloud-config: %w", err)
			}
		}
		// Talos API endpoints: --talos-endpoints, else the file's
		// global.endpoints (the upstream Talos CCM's), else the talosconfig's.
		endpoints := tf.endpoints
		if len(endpoints) == 0 {
			endpoints = rules.Global.Endpoints
		}
		// The talosconfig Talos writes names the Service default/talos
		// ("talos.default"): its endpoints are read through the API server,
		// which answers before cluster DNS can (docs/install.md).
		kubeCfg, err := clientcmd.BuildConfigFromFlags(s.Master, s.Generic.ClientConnection.Kubeconfig)
		if err != nil {
			return fmt.Errorf("the Talos Service's endpoints: API server client: %w", err)
		}
		kube, err := kubernetes.NewForConfig(rest.AddUserAgent(kubeCfg, "talos-ccm/talos-service"))
		if err != nil {
			return fmt.Errorf("the Talos Service's endpoints: API server client: %w", err)
		}
		tc, err := talos.New(cmd.Context(), talos.Options{
			ConfigPath: tf.talosconfig, Context: tf.talosContext, Endpoints: endpoints, Timeout: tf.timeout, Kube: kube,
		})
		if err != nil {
			return err
		}
		// As the upstream Talos CCM: without global.clusterName, the clustername
		// label is the cluster the talosconfig context names (if any).
		clusterFrom := "global.clusterName"
		if rules.Global.ClusterName == "" {
			rules.Global.ClusterName, clusterFrom = tc.ClusterName(), "talosconfig context"
		}
		if rules.Global.ClusterName == "" {
			clusterFrom = "none"
		}
		lookup := tf.lookup
		if lookup <= 0 {
			lookup = 2 * tf.timeout // one attempt per address family
		}
		nodeFacts = facts.NewSource(tc, cloud.NewInterpreter(rules), facts.Options{LookupTimeout: lookup, Observer: reachability})
		provider = cloud.New(nodeFacts)
		// node-ipam-controller: its Talos client, and its flags checked up front
		talosClient = tc
		if s.KubeCloudShared.AllocateNodeCIDRs {
			if _, err := ipamOpts.Config(s.KubeCloudShared.CIDRAllocatorType, s.KubeCloudShared.ClusterCIDR); err != nil {
				return err
			}
		}
		klog.InfoS("talos-ccm configured", "rules", len(rules.Transformations), "enforce", tf.enforce || rules.Global.Enforce,
			"clusterName", rules.Global.ClusterName, "clusterNameFrom", clusterFrom)
		return run(cmd, args)
	}
	cmd.SilenceUsage = true
	return cmd, nil
}

// sharedRecorder is the one event broadcaster of the process; each controller
// records through it under its own name as the event source component.
type sharedRecorder struct {
	once        sync.Once
	broadcaster record.EventBroadcaster
}

func (r *sharedRecorder) recorder(ctx context.Context, client interface {
	CoreV1() typedcorev1.CoreV1Interface
}, component string) record.EventRecorder {
	r.once.Do(func() {
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartStructuredLogging(3)
		b.StartRecordingToSink(events.NewAsyncSink(ctx, &typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, events.Workers, events.Queue))
		go func() { <-ctx.Done(); b.Shutdown() }()
		r.broadcaster = b
	})
	return r.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})
}

// slimNodeCache makes the shared node informer cache Nodes without what no
// talos-ccm controller reads: managedFields, and every part of the status but
// the addresses (images, conditions, node info, capacity: on a real node most
// of its size), with the label and annotation keys and the label values that
// nodes share stored once (see slimNode). Nothing writes a Node's status from
// a cached copy (cloud-node patches status.addresses alone), and an update of
// the Node itself ignores the status it carries. Every controller calls it
// (whichever --controllers enables); it must happen before the informers
// start, which the framework does after all controllers are constructed.
func slimNodeCache(cc *cloudcontrollerconfig.CompletedConfig) {
	// SetTransform fails only once the informer runs; a second call replaces the
	// same function.
	_ = cc.SharedInformers.Core().V1().Nodes().Informer().SetTransform(slimNode)
}
