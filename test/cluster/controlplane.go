package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// controlPlane holds the control plane's processes.
type controlPlane struct {
	etcd, apiserver, kcm, scheduler *proc
}

// setupBridge creates the nodes' bridge in the caller's network namespace.
func setupBridge() error {
	_ = run("ip", "link", "del", bridgeName) // a leftover of this namespace
	for _, argv := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", bridgeName, "type", "bridge"},
		{"ip", "addr", "add", fmt.Sprintf("%s/%d", Gateway, bridgePrefix.Bits()), "dev", bridgeName},
		{"ip", "link", "set", bridgeName, "up"},
	} {
		if err := run(argv...); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	p := c.pki
	gw := Gateway.String()
	if _, _, err := p.issue("apiserver", "kube-apiserver", nil, true,
		[]net.IP{net.ParseIP(gw), net.ParseIP("10.96.0.1"), net.IPv4(127, 0, 0, 1)},
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}); err != nil {
		return err
	}
	if _, _, err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false, nil, nil); err != nil {
		return err
	}
	var err error
	if c.KubeconfigPath, err = p.kubeconfig("admin", c.Server(), "admin", "system:masters"); err != nil {
		return err
	}
	for _, k := range []struct{ name, cn string }{
		{"controller-manager", "system:kube-controller-manager"},
		{"scheduler", "system:kube-scheduler"},
		{"kube-proxy", "system:kube-proxy"},
	} {
		if _, err := p.kubeconfig(k.name, c.Server(), k.cn); err != nil {
			return err
		}
	}
	if err := c.startEtcd(); err != nil {
		return err
	}
	if err := c.StartAPIServer(ctx); err != nil {
		return err
	}
	if c.Config, err = kubeconfigFor(c.KubeconfigPath); err != nil {
		return err
	}
	c.Config.QPS, c.Config.Burst = 100, 200
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}
	if err := c.staticEndpoint(ctx); err != nil {
		return fmt.Errorf("the kubernetes Service's endpoint: %w", err)
	}
	return c.startControllers()
}

func (c *Cluster) startEtcd() error {
	dir := filepath.Join(c.work, "etcd")
	p, err := c.start("etcd", []string{filepath.Join(c.opts.ControlPlaneBinaries, "etcd"),
		"--data-dir=" + dir,
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380",
		"--unsafe-no-fsync", "--quota-backend-bytes=8589934592",
	}, nil)
	if err != nil {
		return err
	}
	c.cp.etcd = p
	return waitHTTP(context.Background(), "etcd", "http://127.0.0.1:2379/health", p, nil)
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) and
// returns once /readyz answers ok.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	p := c.pki
	argv := []string{filepath.Join(c.opts.ControlPlaneBinaries, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=" + Gateway.String(), "--advertise-address=" + Gateway.String(),
		"--secure-port=" + strconv.Itoa(apiPort),
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--tls-cert-file=" + p.path("apiserver.crt"), "--tls-private-key-file=" + p.path("apiserver.key"),
		"--client-ca-file=" + p.CAFile(),
		"--kubelet-client-certificate=" + p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + p.path("apiserver-kubelet-client.key"),
		// The kubelets' serving certificates must chain to the cluster CA:
		// until talos-ccm approves a kubelet's serving CSR, logs and exec on
		// that node fail.
		"--kubelet-certificate-authority=" + p.CAFile(),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-key-file=" + p.path("sa.pub"),
		"--service-account-signing-key-file=" + p.path("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
		// One API server, restarted and stopped by tests: the kubernetes
		// Service's endpoint is the cluster's (staticEndpoint), as a
		// load-balanced control plane's stays while one server restarts,
		// instead of leaving the Service at each stop and coming back only
		// when every kube-proxy has relisted.
		"--endpoint-reconciler-type=none",
	}
	proc, err := c.start("kube-apiserver", argv, nil)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.cp.apiserver = proc
	c.mu.Unlock()
	return waitHTTP(ctx, "kube-apiserver", c.Server()+"/readyz", proc, p)
}

// StopAPIServer stops kube-apiserver (SIGTERM, as a control-plane upgrade
// does); etcd and everything else keep running.
func (c *Cluster) StopAPIServer() {
	c.mu.Lock()
	p := c.cp.apiserver
	c.cp.apiserver = nil
	c.mu.Unlock()
	p.stop(30 * time.Second)
}

// RestartAPIServer stops kube-apiserver and starts it again.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.StopAPIServer()
	return c.StartAPIServer(ctx)
}

func (c *Cluster) startControllers() error {
	p := c.pki
	kcmConfig := p.path("controller-manager.kubeconfig")
	allocate := strconv.FormatBool(c.opts.AllocateNodeCIDRs)
	kcm, err := c.start("kube-controller-manager", []string{filepath.Join(c.opts.ClusterBinaries, "kube-controller-manager"),
		"--kubeconfig=" + kcmConfig, "--authentication-kubeconfig=" + kcmConfig, "--authorization-kubeconfig=" + kcmConfig,
		"--bind-address=127.0.0.1", "--secure-port=10257",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--cluster-signing-cert-file=" + p.CAFile(), "--cluster-signing-key-file=" + p.path("ca.key"),
		"--root-ca-file=" + p.CAFile(),
		"--service-account-private-key-file=" + p.path("sa.key"),
		"--allocate-node-cidrs=" + allocate, "--cluster-cidr=" + ClusterCIDR,
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--node-monitor-grace-period=" + c.opts.NodeMonitorGracePeriod.String(),
		"--node-monitor-period=2s",
		"--profiling=false",
	}, nil)
	if err != nil {
		return err
	}
	c.cp.kcm = kcm
	schedConfig := p.path("scheduler.kubeconfig")
	sched, err := c.start("kube-scheduler", []string{filepath.Join(c.opts.ClusterBinaries, "kube-scheduler"),
		"--kubeconfig=" + schedConfig, "--authentication-kubeconfig=" + schedConfig, "--authorization-kubeconfig=" + schedConfig,
		"--bind-address=127.0.0.1", "--secure-port=10259",
		"--leader-elect=false",
		"--profiling=false",
	}, nil)
	if err != nil {
		return err
	}
	c.cp.scheduler = sched
	return nil
}

func (c *Cluster) stopControlPlane() {
	c.mu.Lock()
	cp := c.cp
	c.cp = controlPlane{}
	c.mu.Unlock()
	cp.scheduler.stop(5 * time.Second)
	cp.kcm.stop(5 * time.Second)
	cp.apiserver.stop(10 * time.Second)
	cp.etcd.stop(10 * time.Second)
}

// waitHTTP polls url until it answers 200 or the process exits. With a pki
// it presents the admin's client certificate and trusts the CA.
func waitHTTP(ctx context.Context, what, url string, p *proc, k *pki) error {
	client := &http.Client{Timeout: 2 * time.Second}
	if k != nil {
		tc, err := k.adminTLS()
		if err != nil {
			return err
		}
		client.Transport = &http.Transport{TLSClientConfig: tc}
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		if done, err := p.exited(); done {
			return false, fmt.Errorf("%s exited: %v", what, err)
		}
		resp, err := client.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("%s at %s: %w", what, url, err)
	}
	return nil
}

// staticEndpoint gives the kubernetes Service its endpoint, the API
// server's address, once (the API server reconciles none: see its flags).
func (c *Cluster) staticEndpoint(ctx context.Context) error {
	const name = "kubernetes"
	port := int32(apiPort)
	ep := &corev1.Endpoints{ //nolint:staticcheck // kube-proxy reads slices; clients may still read Endpoints
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Subsets: []corev1.EndpointSubset{{ //nolint:staticcheck // as above
			Addresses: []corev1.EndpointAddress{{IP: Gateway.String()}},
			Ports:     []corev1.EndpointPort{{Name: "https", Port: port, Protocol: corev1.ProtocolTCP}},
		}},
	}
	if _, err := c.Client.CoreV1().Endpoints(metav1.NamespaceDefault).Create(ctx, ep, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "hybrid-ccm-test-cluster"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{Gateway.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: &port, Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if _, err := c.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}
