package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"sync"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

const (
	ccmNamespace = "kube-system"
	ccmName      = "native-ccm-hcloud"
)

var (
	// env is the real control plane.
	env *testenv.Env
	// ccmConfig authenticates as the native CCM's ServiceAccount (client certificate).
	ccmConfig *rest.Config
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

// run runs the tests, then removes the gate binary they built (gateBinary).
func run(m *testing.M) int {
	defer func() {
		if gateBinDir != "" {
			_ = os.RemoveAll(gateBinDir)
		}
	}()
	if _, err := testenv.AssetsDir(); err != nil {
		return m.Run() // unit tests only; integration tests skip
	}
	return testenv.Run(m, testenv.Options{}, func(e *testenv.Env) {
		env = e
		if err := gatetest.GrantNativeCCM(context.Background(), e.Client, ccmNamespace, ccmName); err != nil {
			panic(err)
		}
		if err := gatetest.GrantLoadBalancers(context.Background(), e.Client, ccmNamespace, ccmName); err != nil {
			panic(err)
		}
		cfg, err := gatetest.ServiceAccountUser(e, ccmNamespace, ccmName)
		if err != nil {
			panic(err)
		}
		ccmConfig = cfg
	})
}

func needEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("no control plane: set KUBEBUILDER_ASSETS=$(hack/control-plane.sh)")
	}
}

// gate is a ccm-gate running in-process on a loopback HTTP server.
type gate struct {
	proxy *proxy.Proxy
	url   string
	// seen records the requests the gate received, as the client sent them.
	seen *recorder
}

// startGate starts a gate for platform; cfg.Upstream defaults to the CCM's
// identity with OwnCredentials (a client certificate cannot be forwarded).
func startGate(t *testing.T, platform string, edit func(*proxy.Config)) *gate {
	t.Helper()
	cfg := proxy.Config{Upstream: ccmConfig, Platform: platform, Credentials: proxy.OwnCredentials}
	if edit != nil {
		edit(&cfg)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := p.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := httptest.NewServer(rec.wrap(p))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		cancel()
	})
	return &gate{proxy: p, url: srv.URL, seen: rec}
}

// config is a client configuration that uses the gate as its API server.
func (g *gate) config() *rest.Config {
	return &rest.Config{Host: g.url, QPS: -1, Burst: -1}
}

func (g *gate) client(t *testing.T) kubernetes.Interface {
	t.Helper()
	return kubernetes.NewForConfigOrDie(g.config())
}

type recorder struct {
	mu   sync.Mutex
	reqs []*url.URL
}

func (r *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u := *req.URL
		r.mu.Lock()
		r.reqs = append(r.reqs, &u)
		r.mu.Unlock()
		h.ServeHTTP(w, req)
	})
}

// find returns the recorded requests for which match is true.
func (r *recorder) find(match func(*url.URL) bool) []*url.URL {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(r.reqs), func(u *url.URL) bool { return !match(u) })
}
