// Package fleet is a Talos fleet of several platforms on the real test
// cluster (test/cluster): every node is a machine that answers the Talos API
// on its own address, port 50000 (the simulated endpoint of test/talosnode,
// with the node's platform metadata), and the cluster pulls its images from a
// registry the fleet runs (test/registry) the way users' clusters do: the
// pause image, CoreDNS and the upstream CCMs' images under their upstream
// names (host-mapped), and the product's images and charts once Release has
// run `make release` into it. Like Talos at bootstrap, it deploys cluster
// DNS (CoreDNS behind the Service kube-dns) unless told not to, and keeps
// the Service Talos keeps for its API (talos.default).
//
// It owns the outside world of an install: machines, their Talos API, the
// registry. Installing the product is the caller's (Helm from the registry,
// as docs/install.md says). It must not import testing (hybridctl's demo
// links it).
package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/cluster"
	"github.com/hybrid-ccm/hybrid-ccm/test/registry"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TalosPort is where every machine answers the Talos API, as Talos' apid.
const TalosPort = talosnode.ApidPort

// Machine is one Talos machine: a real node of the cluster, and what its
// platform says about it.
type Machine struct {
	// Name is the node's name (and the machine's hostname).
	Name string
	// Platform is Talos' platform name (aws, hcloud, gcp, metal, ...).
	Platform string
	// ProviderID is what the platform's metadata says; empty on metal.
	ProviderID string
	// ControlPlane makes it a control-plane node (the product's pods run on
	// those).
	ControlPlane bool
	// InstanceID, InstanceType, Region, Zone are the rest of its metadata
	// (InstanceID defaults to the last part of ProviderID).
	InstanceID, InstanceType, Region, Zone string
}

// Options describe a fleet.
type Options struct {
	Machines []Machine
	// Images are pushed before the nodes need them: upstream image reference
	// (e.g. the profiles' CCM images) → the static binary the image runs.
	Images map[string]string
	// Log gets one line per step.
	Log io.Writer
	// AllocateNodeCIDRs: kube-controller-manager allocates the nodes' pod
	// CIDRs, as on a Talos cluster by default (otherwise only talos-ccm's
	// node IPAM does, when its chart turns it on).
	AllocateNodeCIDRs bool
	// ReleaseCredentials, when set, make the registry's release repositories
	// private (registry.RequireAuth): Release pushes and fleethelm pulls
	// charts with them, and pods pull the product's images only with an
	// image pull Secret (CreatePullSecret). The pause and upstream images
	// stay anonymous.
	ReleaseCredentials *registry.Credentials
	// TalosAPIByAddress writes the control planes' own addresses into the
	// talosconfig instead of the Talos Service (talos.default): for a
	// talos-ccm release that resolves the Service only through cluster DNS,
	// which may not answer before talos-ccm has initialized nodes
	// (test/upgrade's previous release).
	TalosAPIByAddress bool
	// NoClusterDNS leaves cluster DNS out, as on a Talos cluster with
	// cluster.coreDNS.disabled: the kubelets still name the DNS Service's
	// address, and nothing answers there. By default the fleet deploys
	// CoreDNS as Talos does (hack/coredns.sh builds it once into its cache;
	// `make coredns`).
	NoClusterDNS bool
	// DeferClusterDNS pushes CoreDNS's image but leaves creating cluster
	// DNS to the caller (DeployClusterDNS): a test that applies the
	// manifests Talos applies at bootstrap (cluster.externalCloudProvider.
	// manifests) applies Talos' own with them, in one go, as Talos does.
	DeferClusterDNS bool
}

// Fleet is a running fleet.
type Fleet struct {
	*cluster.Cluster
	Registry *registry.Registry
	Talos    *talosnode.Endpoint
	Machines []Machine

	work   string
	log    io.Writer
	clouds []*Clouds // StartClouds's: machines that join become their instances

	talosByAddress bool
	coreDNSImage   string // pushed by Up; "" without cluster DNS
}

// Up brings the cluster up with one node per machine, starts the registry
// on the cluster's gateway (port 5000) and pushes the pause image and
// opts.Images to it, deploys cluster DNS (unless opts.NoClusterDNS or
// DeferClusterDNS; it does not wait for it), and makes every machine answer
// the Talos API. On error
// everything started is stopped.
func Up(ctx context.Context, opts Options) (_ *Fleet, err error) {
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	var coreDNS string
	if !opts.NoClusterDNS {
		// Before anything starts: a missing build fails at once.
		if coreDNS, err = BuildCoreDNS(ctx, testenv.RepoRoot()); err != nil {
			return nil, err
		}
	}
	work, err := os.MkdirTemp("", "hybrid-ccm-fleet-")
	if err != nil {
		return nil, err
	}
	f := &Fleet{Machines: opts.Machines, work: work, log: opts.Log, talosByAddress: opts.TalosAPIByAddress}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.Down())
		}
	}()
	hosts := filepath.Join(work, "registry-hosts")
	var nodes []cluster.NodeOptions
	for _, m := range opts.Machines {
		nodes = append(nodes, cluster.NodeOptions{Name: m.Name, ControlPlane: m.ControlPlane})
	}
	if f.Cluster, err = cluster.Up(ctx, cluster.Options{Nodes: nodes, RegistryHosts: hosts, SandboxImage: registry.PauseImage, Log: opts.Log, AllocateNodeCIDRs: opts.AllocateNodeCIDRs}); err != nil {
		return nil, err
	}
	if err := f.installTalosCRDs(ctx); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", net.JoinHostPort(cluster.Gateway.String(), "5000"))
	if err != nil {
		return nil, fmt.Errorf("fleet: registry: %w", err)
	}
	var regOpts []registry.Option
	if c := opts.ReleaseCredentials; c != nil {
		regOpts = append(regOpts, registry.RequireAuth(registry.ReleaseRepository, *c))
	}
	if f.Registry, err = registry.Start(lis, filepath.Join(work, "registry"), regOpts...); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if err := f.Registry.WriteHostsDir(hosts); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	f.logf("registry %s: pause image, %d upstream images", f.Registry.Host(), len(opts.Images))
	if _, err := f.Registry.PushPause(ctx); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	for ref, bin := range opts.Images {
		if _, err := f.Registry.PushBinary(ctx, ref, bin, registry.ImageOptions{}); err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
	}
	if coreDNS != "" {
		if err := f.pushCoreDNS(ctx, coreDNS); err != nil {
			return nil, err
		}
		if !opts.DeferClusterDNS {
			if err := f.DeployClusterDNS(ctx); err != nil {
				return nil, err
			}
		}
	}
	if f.Talos, err = talosnode.Start(); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	for _, m := range opts.Machines {
		if err := f.answerTalos(m); err != nil {
			return nil, err
		}
	}
	f.logf("%d machines answer the Talos API on port %d", len(opts.Machines), TalosPort)
	if err := f.keepTalosService(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// answerTalos makes the machine's node answer the Talos API with its
// metadata.
func (f *Fleet) answerTalos(m Machine) error {
	n := f.Node(m.Name)
	md := m.metadata()
	if _, err := f.Talos.AddNode(m.Name, []string{n.IP.String()}, talosnode.Spec{Metadata: &md,
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: n.IP.String() + "/24"}}}); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	// Each machine is its own apid: it answers for itself and forwards a
	// request about another machine to that machine's apid.
	if err := n.ServeTCP(TalosPort, func(lis net.Listener) { _ = f.Talos.ServeMachine(lis, m.Name) }); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	return nil
}

// AddMachine starts one more machine as a Talos machine joins a cluster: its
// kubelet registers; the clouds StartClouds started know its instance, before
// it answers the Talos API (so before talos-ccm can initialize its node, and
// so before its native CCM can see it). Not safe for concurrent use.
func (f *Fleet) AddMachine(ctx context.Context, m Machine) error {
	// Refused before anything starts: nothing half-added.
	for _, o := range f.Machines {
		if o.Name == m.Name {
			return fmt.Errorf("fleet: machine %s is there already", m.Name)
		}
	}
	if m.Platform == "aws" && m.metadata().InstanceID == "" {
		return fmt.Errorf("fleet: aws machine %s has no instance ID (Machine.InstanceID or ProviderID)", m.Name)
	}
	n, err := f.Cluster.AddNode(ctx, cluster.NodeOptions{Name: m.Name, ControlPlane: m.ControlPlane})
	if err != nil {
		return err
	}
	for _, c := range f.clouds {
		if err := c.add(m, n.IP.String()); err != nil {
			return err
		}
	}
	f.Machines = append(f.Machines, m)
	if err := f.answerTalos(m); err != nil {
		return err
	}
	if m.ControlPlane {
		return f.keepTalosService(ctx)
	}
	return nil
}

func (m Machine) metadata() runtime.PlatformMetadataSpec {
	md := runtime.PlatformMetadataSpec{Platform: m.Platform, Hostname: m.Name, Region: m.Region, Zone: m.Zone,
		InstanceType: m.InstanceType, ProviderID: m.ProviderID, InstanceID: m.InstanceID}
	if md.InstanceID == "" && m.ProviderID != "" {
		md.InstanceID = m.ProviderID[strings.LastIndex(m.ProviderID, "/")+1:]
	}
	return md
}

// Release runs `make release` of the repository into the fleet's registry
// at version (images for this machine's platform and the charts), as a
// user's release to their own registry.
func (f *Fleet) Release(ctx context.Context, version string) error {
	return f.ReleaseFrom(ctx, testenv.RepoRoot(), version)
}

// ReleaseFrom is Release from another checkout (an earlier release of the
// repository, for upgrades).
func (f *Fleet) ReleaseFrom(ctx context.Context, root, version string) error {
	f.logf("make release VERSION=%s REGISTRY=%s from %s", version, f.Registry.ReleaseRegistry(), root)
	return f.Registry.Release(ctx, root, version, f.log)
}

// CreatePullSecret creates the image pull Secret name in namespace that
// pulls from the fleet's private release repositories (type
// kubernetes.io/dockerconfigjson, what `kubectl create secret
// docker-registry` makes), as a user creates one for their private registry.
func (f *Fleet) CreatePullSecret(ctx context.Context, namespace, name string) error {
	data, err := f.Registry.DockerConfigJSON()
	if err != nil {
		return fmt.Errorf("fleet: pull Secret %s/%s: %w", namespace, name, err)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: data},
	}
	if _, err := f.Client.CoreV1().Secrets(namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("fleet: pull Secret %s/%s: %w", namespace, name, err)
	}
	return nil
}

// ChartRef is the OCI reference of a released chart (without version).
func (f *Fleet) ChartRef(chart string) string {
	return "oci://" + f.Registry.ReleaseRegistry() + "/charts/" + chart
}

// TalosConfig is the talosconfig Talos puts in the Secret it answers a
// talos.dev ServiceAccount with: a certificate of role, and one endpoint,
// the Service Talos keeps for its API (talos.default, port 50000), whose
// endpoints are the control planes' apids; each forwards a request to the
// machine it names.
func (f *Fleet) TalosConfig(role string) ([]byte, error) {
	endpoints := []string{talos.ServiceName + "." + talos.ServiceNamespace}
	if f.talosByAddress {
		endpoints = nil
		for _, m := range f.Machines {
			if m.ControlPlane {
				endpoints = append(endpoints, f.Node(m.Name).IP.String())
			}
		}
	}
	path := filepath.Join(f.work, "talosconfig-"+strings.ReplaceAll(role, ":", "-"))
	if err := f.Talos.WriteClientConfig(path, role, endpoints...); err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}

// keepTalosService does what Talos does in a cluster with Kubernetes Talos
// API access: the Service default/talos (no selector, port apid 50000) and
// its EndpointSlice talos-ipv4 listing the control planes' addresses
// (talosnode.KeepService).
func (f *Fleet) keepTalosService(ctx context.Context) error {
	var apids []netip.AddrPort
	var names []string
	for _, m := range f.Machines {
		if !m.ControlPlane {
			continue
		}
		apids = append(apids, netip.AddrPortFrom(f.Node(m.Name).IP.Unmap(), TalosPort))
		names = append(names, m.Name)
	}
	if err := talosnode.KeepService(ctx, f.Client, apids...); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	f.logf("Service %s/%s: the Talos API at the control planes %s", talos.ServiceNamespace, talos.ServiceName, strings.Join(names, ", "))
	return nil
}

// PowerOff powers the machine off: its node's processes and containers die,
// its Talos API stops answering.
func (f *Fleet) PowerOff(name string) error {
	n := f.Node(name)
	if n == nil {
		return fmt.Errorf("fleet: no machine %s", name)
	}
	f.logf("machine %s: power off", name)
	if tn := f.Talos.Node(name); tn != nil {
		tn.SetUnreachable(true, false)
	}
	n.Stop()
	return nil
}

// PowerOn boots a machine again.
func (f *Fleet) PowerOn(ctx context.Context, name string) error {
	n := f.Node(name)
	if n == nil {
		return fmt.Errorf("fleet: no machine %s", name)
	}
	f.logf("machine %s: power on", name)
	if err := n.Start(ctx); err != nil {
		return err
	}
	if tn := f.Talos.Node(name); tn != nil {
		tn.SetUnreachable(false, false)
	}
	return nil
}

// Down stops everything.
func (f *Fleet) Down() error {
	var errs []error
	if f.Cluster != nil {
		errs = append(errs, f.Cluster.Down())
	}
	if f.Talos != nil {
		f.Talos.Stop()
	}
	if f.Registry != nil {
		errs = append(errs, f.Registry.Close())
	}
	errs = append(errs, os.RemoveAll(f.work))
	return errors.Join(errs...)
}

func (f *Fleet) logf(format string, args ...any) {
	fmt.Fprintf(f.log, "fleet: "+format+"\n", args...)
}

// installTalosCRDs creates what Talos itself installs in every cluster with
// Kubernetes Talos API access: the talos.dev ServiceAccount CRD (its
// stand-in in charts/test/testdata/crds), and waits until it is served.
func (f *Fleet) installTalosCRDs(ctx context.Context) error {
	dir := filepath.Join(testenv.RepoRoot(), "charts", "test", "testdata", "crds")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("fleet: Talos CRDs in %s: %v", dir, err)
	}
	cs, err := apiextensionsclient.NewForConfig(f.Config)
	if err != nil {
		return err
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return fmt.Errorf("fleet: %s: %w", file, err)
		}
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("fleet: create CRD %s: %w", crd.Name, err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return fmt.Errorf("fleet: CRD %s not established: %w", crd.Name, err)
		}
	}
	return nil
}
