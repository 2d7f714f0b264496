// Package cluster brings up a real Kubernetes cluster on this machine for the
// tests and the demo, and tears it down completely: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, and several real nodes, each a
// kubelet with its own containerd and kube-proxy in a network, mount and UTS
// namespace of its own, with its own address on a shared bridge and pod
// networking between the nodes (the bridge CNI plugin, configured by
// containerd from the pod CIDR the node is given, plus routes this package
// keeps).
//
// Everything runs inside the network namespace of the calling process, which
// must be one the test made for itself (test/netns): the bridge, the routes
// and every iptables rule disappear with it, and no traffic leaves the
// machine. What a cluster changes on the host itself (the kubelets' global
// sysctls, the cgroups of the nodes, a work directory) is recorded in a
// state file, undone by Down, on SIGINT/SIGTERM by the caller's Down, and by
// the next Up (Recover) after a SIGKILL.
//
// The binaries: kube-apiserver and etcd from hack/control-plane.sh
// (KUBEBUILDER_ASSETS), kubelet, kube-controller-manager, kube-scheduler and
// kube-proxy from hack/cluster-binaries.sh (HYBRID_CCM_CLUSTER_BINARIES), and
// containerd, runc and the CNI plugins from Debian's packages
// (hack/cluster-packages.sh). `make test` and `make demo` provide all three.
//
// It owns processes, namespaces and host state; it knows nothing of the
// product. It must not import testing (hybridctl's demo links it).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Network of every cluster: a bridge in the caller's network namespace holds
// the gateway; nodes take the addresses after it.
var (
	bridgePrefix = netip.MustParsePrefix("10.99.0.0/24")
	// Gateway is the bridge's address in the caller's namespace: the API
	// server and anything the test serves to the nodes (a registry) listen
	// there.
	Gateway     = netip.MustParseAddr("10.99.0.1")
	firstNodeIP = netip.MustParseAddr("10.99.0.11")
)

const (
	bridgeName = "hccm0"
	// ClusterCIDR is the pod network; ServiceCIDR the Services'.
	ClusterCIDR = "10.244.0.0/16"
	ServiceCIDR = "10.96.0.0/16"
	// ClusterDomain is the cluster's DNS domain, Talos' default
	// (cluster.network.dnsDomain).
	ClusterDomain = "cluster.local"
	apiPort       = 6443
)

// DNSServiceIP is where pods find cluster DNS: the tenth address of
// ServiceCIDR, as Talos chooses it. Every kubelet names it (clusterDNS,
// with clusterDomain ClusterDomain) as Talos configures kubelets, whether or
// not a DNS server runs: the cluster runs none of its own; test/fleet
// deploys CoreDNS at this address as Talos does.
var DNSServiceIP = func() netip.Addr {
	a := netip.MustParsePrefix(ServiceCIDR).Addr()
	for range 10 {
		a = a.Next()
	}
	return a
}()

// NodeOptions describe one node.
type NodeOptions struct {
	// Name is the node's (and its kubelet's) name.
	Name string
	// ControlPlane makes it a control-plane node as Talos makes one: its
	// kubelet registers it with the control-plane NoSchedule taint, and the
	// node-role label (which NodeRestriction forbids the kubelet) is set
	// after registration with an admin credential.
	ControlPlane bool
}

// Options describe a cluster.
type Options struct {
	// Nodes to start (at least one).
	Nodes []NodeOptions
	// ControlPlaneBinaries holds kube-apiserver and etcd; default
	// KUBEBUILDER_ASSETS.
	ControlPlaneBinaries string
	// ClusterBinaries holds kubelet, kube-controller-manager, kube-scheduler
	// and kube-proxy; default HYBRID_CCM_CLUSTER_BINARIES.
	ClusterBinaries string
	// SandboxImage is containerd's pause image (it must be pullable).
	SandboxImage string
	// RegistryHosts is containerd's registry host configuration directory
	// (config_path: <host>/hosts.toml), if any.
	RegistryHosts string
	// AllocateNodeCIDRs turns kube-controller-manager's own pod CIDR
	// allocator on. Off by default: talos-ccm's IPAM allocates them.
	AllocateNodeCIDRs bool
	// NodeMonitorGracePeriod is how long a node may go without a heartbeat
	// before kube-controller-manager marks it NotReady (default 20s).
	NodeMonitorGracePeriod time.Duration
	// Log receives one line per step.
	Log io.Writer
}

// Cluster is a running cluster.
type Cluster struct {
	opts  Options
	work  string
	pki   *pki
	state *hostState
	lock  *os.File // the machine's cluster lock, held until Down
	// before and after are the host as Up found it and as Down left it,
	// both read under the lock.
	before, after HostSnapshot
	downMu        sync.Mutex // one Down at a time (a signal may come during one)
	// stateMu guards state's lists (nodes boot concurrently with Down).
	stateMu sync.Mutex

	// Config is an admin rest.Config; Client an admin clientset;
	// KubeconfigPath an admin kubeconfig for subprocesses (kubectl, helm).
	Config         *rest.Config
	Client         kubernetes.Interface
	KubeconfigPath string

	mu    sync.Mutex
	cp    controlPlane
	nodes []*Node

	stopRoutes context.CancelFunc
	routesDone chan struct{}
}

// Up starts a cluster and returns when the API server answers and every node
// has registered. On error everything started is stopped again.
func Up(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if len(opts.Nodes) == 0 {
		return nil, errors.New("cluster: no nodes")
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("cluster: needs root (namespaces, mounts, cgroups)")
	}
	lock, err := lockHost(ctx)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	if err := Recover(); err != nil {
		return nil, fmt.Errorf("cluster: undo a previous cluster: %w", err)
	}
	// The host as this cluster finds it, under the lock: no other cluster
	// of this machine changes it until Down has taken the after-snapshot.
	before, err := TakeHostSnapshot()
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if opts.ControlPlaneBinaries == "" {
		opts.ControlPlaneBinaries = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if opts.ClusterBinaries == "" {
		opts.ClusterBinaries = os.Getenv("HYBRID_CCM_CLUSTER_BINARIES")
	}
	if opts.NodeMonitorGracePeriod == 0 {
		opts.NodeMonitorGracePeriod = 20 * time.Second
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if err := checkBinaries(opts); err != nil {
		return nil, err
	}
	// Not under /var/lib, /var/log or /run: the nodes mount their own there.
	work, err := os.MkdirTemp("/tmp", "hybrid-ccm-cluster-")
	if err != nil {
		return nil, err
	}
	start, err := procStart(os.Getpid())
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, work: work, lock: lock, before: before, state: &hostState{Owner: os.Getpid(), OwnerStart: start, Work: work, Sysctls: readSysctls()}}
	if err := c.state.save(); err != nil {
		_ = os.RemoveAll(work)
		return nil, fmt.Errorf("cluster: record host state: %w", err)
	}
	register(c)
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Down())
		}
	}()
	for _, d := range []string{"logs", "pki"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			return nil, err
		}
	}
	if c.pki, err = newPKI(filepath.Join(work, "pki")); err != nil {
		return nil, fmt.Errorf("cluster: pki: %w", err)
	}
	c.logf("network: bridge %s %s", bridgeName, Gateway)
	if err := setupBridge(); err != nil {
		return nil, fmt.Errorf("cluster: bridge: %w", err)
	}
	c.logf("control plane: etcd, kube-apiserver on %s:%d, kube-controller-manager, kube-scheduler", Gateway, apiPort)
	if err := c.startControlPlane(ctx); err != nil {
		return nil, fmt.Errorf("cluster: control plane: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	c.stopRoutes, c.routesDone = cancel, make(chan struct{})
	go c.keepRoutes(rctx)
	for _, no := range opts.Nodes {
		if _, err := c.AddNode(ctx, no); err != nil {
			return nil, err
		}
	}
	c.logf("cluster up: %d nodes registered; kubeconfig %s", len(c.nodes), c.KubeconfigPath)
	return c, nil
}

// AddNode starts one more node (a machine joining the cluster) and returns
// once it has registered.
func (c *Cluster) AddNode(ctx context.Context, no NodeOptions) (*Node, error) {
	c.mu.Lock()
	ip := firstNodeIP
	for _, n := range c.nodes {
		if n.Name == no.Name {
			c.mu.Unlock()
			return nil, fmt.Errorf("cluster: node %s exists", no.Name)
		}
		if !n.IP.Less(ip) {
			ip = n.IP.Next()
		}
	}
	c.mu.Unlock()
	if !bridgePrefix.Contains(ip) || ip == netip.MustParseAddr("10.99.0.255") {
		return nil, fmt.Errorf("cluster: node %s: no address left on %s", no.Name, bridgePrefix)
	}
	n, err := c.newNode(no, ip)
	if err != nil {
		return nil, fmt.Errorf("cluster: node %s: %w", no.Name, err)
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	c.logf("node %s: %s, containerd, kubelet, kube-proxy", n.Name, n.IP)
	if err := n.Start(ctx); err != nil {
		return nil, fmt.Errorf("cluster: node %s: %w", n.Name, err)
	}
	if err := n.waitRegistered(ctx); err != nil {
		return nil, fmt.Errorf("cluster: node %s: %w", n.Name, err)
	}
	return n, nil
}

// Work is the cluster's work directory (logs under logs/).
func (c *Cluster) Work() string { return c.work }

// Nodes are the cluster's nodes in the order of Options.Nodes.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.nodes...)
}

// Node is the node of that name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// CAFile is the cluster CA (what kubelets' serving certificates chain to).
func (c *Cluster) CAFile() string { return c.pki.CAFile() }

// Server is the API server's URL as nodes and pods reach it.
func (c *Cluster) Server() string { return fmt.Sprintf("https://%s:%d", Gateway, apiPort) }

// Down stops everything and restores the host; it may be called more than
// once and after a failed Up.
func (c *Cluster) Down() error {
	c.downMu.Lock()
	defer c.downMu.Unlock()
	defer unregister(c)
	if c.stopRoutes != nil {
		c.stopRoutes()
		<-c.routesDone
		c.stopRoutes = nil
	}
	var wg sync.WaitGroup
	for _, n := range c.Nodes() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.stopDaemons(10 * time.Second)
			n.Stop()
		}()
	}
	wg.Wait()
	c.stopControlPlane()
	_ = run("ip", "link", "del", bridgeName)
	if c.state == nil {
		return nil
	}
	err := c.state.undo()
	c.state = nil
	if after, serr := TakeHostSnapshot(); serr == nil {
		c.after = after
	} else {
		err = errors.Join(err, serr)
	}
	if c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
	return err
}

// HostSnapshots are the host as Up found it and as Down left it, read while
// the cluster held the machine's cluster lock (after is zero before Down).
func (c *Cluster) HostSnapshots() (before, after HostSnapshot) { return c.before, c.after }

// Logs returns the last max bytes of every daemon's log, for a failed test.
func (c *Cluster) Logs(max int) string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(c.work, "logs", "*.log"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if len(data) > max {
			data = data[len(data)-max:]
		}
		fmt.Fprintf(&b, "==> %s <==\n%s\n", filepath.Base(f), data)
	}
	return b.String()
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.opts.Log, "cluster: "+format+"\n", args...)
}

func (c *Cluster) logDir() string { return filepath.Join(c.work, "logs") }

func checkBinaries(o Options) error {
	var missing []string
	for _, set := range []struct {
		dir   string
		names []string
	}{
		{o.ControlPlaneBinaries, []string{"kube-apiserver", "etcd"}},
		{o.ClusterBinaries, []string{"kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"}},
	} {
		dir := set.dir
		for _, n := range set.names {
			if dir == "" {
				missing = append(missing, n)
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				missing = append(missing, filepath.Join(dir, n))
			}
		}
	}
	for _, n := range []string{"containerd", "containerd-shim-runc-v2", "runc", "iptables", "conntrack", "ip", "nsenter", "unshare", "mount"} {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		missing = append(missing, "/usr/lib/cni/bridge")
	}
	if len(missing) > 0 {
		return fmt.Errorf("cluster: missing %s: run `make test` (it builds kube binaries with hack/control-plane.sh and hack/cluster-binaries.sh and installs containerd, runc, the CNI plugins, iptables and conntrack with hack/cluster-packages.sh), or set KUBEBUILDER_ASSETS and HYBRID_CCM_CLUSTER_BINARIES", strings.Join(missing, ", "))
	}
	return nil
}

// kubeconfigFor loads a rest.Config from a kubeconfig file.
func kubeconfigFor(path string) (*rest.Config, error) {
	return clientcmd.BuildConfigFromFlags("", path)
}
