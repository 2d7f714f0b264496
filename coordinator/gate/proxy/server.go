package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// ServerOptions are ccm-gate's command-line options.
type ServerOptions struct {
	// Listen is the proxy's address; loopback, because the CCM is in the same pod.
	Listen string
	// TLSDir holds the self-signed serving certificate; empty serves plain HTTP.
	TLSDir string
	// HealthListen serves /livez and /readyz (no data beyond "ok"; kubelet
	// probes reach it on the pod IP); empty disables it.
	HealthListen string
	// MetricsListen serves /metrics, without authentication: keep it on
	// loopback. Empty disables it.
	MetricsListen string
	// Kubeconfig of the upstream API server; empty: in-cluster configuration.
	Kubeconfig string
	// Platform and PlatformLabel define the view.
	Platform      string
	PlatformLabel string
	// DomainSelector narrows the view to the CCM's ownership domain.
	DomainSelector string
	// Credentials is "forward" or "own".
	Credentials string
	// ClientTokenFile, when set, holds the only bearer token the proxy accepts
	// (created at start if absent); it requires Credentials "own".
	ClientTokenFile string
	// LoadBalancerClass and DefaultLoadBalancerClass define the view of
	// Services; without a class the CCM sees none.
	LoadBalancerClass        string
	DefaultLoadBalancerClass bool
	// StartupAccess is what the gate's identity must be allowed before
	// /readyz first answers ok (Config.StartupAccess), in Access's flag form.
	StartupAccess []string
	// Cache keeps the platform's node names in memory for single-node checks
	// (and the history of Services in the view).
	Cache bool
}

// DefaultServerOptions are the defaults of the flags.
func DefaultServerOptions() ServerOptions {
	return ServerOptions{
		Listen:        "127.0.0.1:20258",
		HealthListen:  "127.0.0.1:21258",
		MetricsListen: "127.0.0.1:21259",
		PlatformLabel: names.PlatformLabel,
		Credentials:   string(ForwardCredentials),
		Cache:         true,
	}
}

// BindFlags registers the options as flags.
func (o *ServerOptions) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "Address the proxy serves the native CCM on (keep it on loopback).")
	fs.StringVar(&o.TLSDir, "tls-dir", o.TLSDir, "Directory for the self-signed serving certificate ("+CertFile+", "+KeyFile+"); empty serves plain HTTP.")
	fs.StringVar(&o.HealthListen, "health-listen", o.HealthListen, "Address of /livez and /readyz (kubelet probes need the pod IP, e.g. :21258); empty disables them.")
	fs.StringVar(&o.MetricsListen, "metrics-listen", o.MetricsListen, "Address of /metrics, served without authentication (keep it on loopback); empty disables it.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Kubeconfig of the API server; empty uses the pod's in-cluster configuration.")
	fs.StringVar(&o.Platform, "platform", o.Platform, "Platform whose nodes the CCM may see (value of --platform-label). Required.")
	fs.StringVar(&o.DomainSelector, "domain-selector", o.DomainSelector, "Label selector of the CCM's ownership domain within the platform (e.g. topology.kubernetes.io/region=eu-west-1): the view shows only the platform's nodes it matches. Only =, == and in requirements. Empty: every node of the platform.")
	fs.StringVar(&o.PlatformLabel, "platform-label", o.PlatformLabel, "Node label that routes nodes to platforms.")
	fs.StringVar(&o.Credentials, "credentials", o.Credentials, `Whose credentials reach the API server: "forward" (the CCM's own, default) or "own" (the gate's kubeconfig; only where the CCM's cannot be forwarded).`)
	fs.StringVar(&o.ClientTokenFile, "client-token-file", o.ClientTokenFile, `File with the only bearer token the proxy accepts, created with a random token at start if absent (share its directory with the CCM alone); requires --credentials=own. Empty: no client authentication.`)
	fs.StringVar(&o.LoadBalancerClass, "load-balancer-class", o.LoadBalancerClass, "spec.loadBalancerClass of the Services this CCM serves: it sees those of type LoadBalancer, presented without the class. Empty: it sees no Service.")
	fs.BoolVar(&o.DefaultLoadBalancerClass, "default-load-balancer-class", o.DefaultLoadBalancerClass, "The CCM also serves Services of type LoadBalancer without a class (at most one CCM per cluster); requires --load-balancer-class.")
	fs.StringArrayVar(&o.StartupAccess, "startup-access", o.StartupAccess, `Something the gate's identity must be allowed (SelfSubjectAccessReview) before /readyz first answers ok, e.g. "verb=get,resource=configmaps,namespace=kube-system,name=extension-apiserver-authentication" (keys verb, group, resource, subresource, namespace, name); repeatable.`)
	fs.BoolVar(&o.Cache, "cache", o.Cache, "Keep the platform's node names in memory for single-node checks (otherwise every check reads the node). The history of the Services in the view is kept either way.")
}

// Serve runs ccm-gate until ctx ends. ready, if not nil, is called once the
// listeners accept connections, with the proxy's URL and the health and
// metrics addresses (empty when disabled).
func Serve(ctx context.Context, o ServerOptions, ready func(proxyURL, healthAddr, metricsAddr string)) error {
	const op = "proxy.Serve"
	log := klog.FromContext(ctx)
	var upstream *rest.Config
	var err error
	if o.Kubeconfig != "" {
		upstream, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	} else {
		upstream, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("%s: upstream configuration: %w", op, err)
	}
	var clientToken []byte
	if o.ClientTokenFile != "" {
		// Written before the listeners open: once the startup probe passes, the
		// CCM finds it.
		if clientToken, err = LoadOrCreateClientToken(o.ClientTokenFile); err != nil {
			return err
		}
	}
	access := make([]Access, 0, len(o.StartupAccess))
	for _, s := range o.StartupAccess {
		a, err := ParseAccess(s)
		if err != nil {
			return fmt.Errorf("%s: --startup-access: %w", op, err)
		}
		access = append(access, a)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p, err := New(Config{
		Upstream:                 upstream,
		Platform:                 o.Platform,
		PlatformLabel:            o.PlatformLabel,
		DomainSelector:           o.DomainSelector,
		Credentials:              CredentialMode(o.Credentials),
		ClientToken:              clientToken,
		LoadBalancerClass:        o.LoadBalancerClass,
		DefaultLoadBalancerClass: o.DefaultLoadBalancerClass,
		DisableCache:             !o.Cache,
		StartupAccess:            access,
		Registerer:               reg,
		Log:                      log,
	})
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 4)
	go func() {
		if err := p.Start(ctx); err != nil && ctx.Err() == nil {
			errs <- err
		}
	}()

	var servers []*http.Server
	listen := func(what, addr string, h http.Handler) (string, error) {
		if addr == "" {
			return "", nil
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return "", fmt.Errorf("%s: %s listener: %w", op, what, err)
		}
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, hs)
		go func() { errs <- ignoreClosed(hs.Serve(ln)) }()
		return ln.Addr().String(), nil
	}
	healthAddr, err := listen("health", o.HealthListen, p.HealthHandler(nil))
	if err != nil {
		return err
	}
	metricsAddr, err := listen("metrics", o.MetricsListen, MetricsHandler(reg))
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("%s: listener: %w", op, err)
	}
	ps := &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second}
	servers = append(servers, ps)
	scheme := "http"
	if o.TLSDir != "" {
		cert, err := LoadOrCreateServingCert(o.TLSDir)
		if err != nil {
			_ = ln.Close()
			return err
		}
		ps.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
		ln = tls.NewListener(ln, ps.TLSConfig)
		scheme = "https"
	}
	go func() { errs <- ignoreClosed(ps.Serve(ln)) }()
	log.Info("ccm-gate serving", "address", scheme+"://"+ln.Addr().String(), "health", healthAddr, "metrics", metricsAddr, "platform", o.Platform, "services", p.serviceView.Description, "credentials", o.Credentials, "clientToken", o.ClientTokenFile != "", "upstream", upstream.Host)
	if ready != nil {
		ready(scheme+"://"+ln.Addr().String(), healthAddr, metricsAddr)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
	}
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShutdown()
	for _, s := range servers {
		_ = s.Shutdown(shutdown)
	}
	return runErr
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
