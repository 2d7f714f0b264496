package proxy_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	clientfeatures "k8s.io/client-go/features"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
)

// watchListGates overrides client-go's WatchListClient feature gate.
type watchListGates struct {
	clientfeatures.Gates
	on bool
}

func (g watchListGates) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return g.on
	}
	return g.Gates.Enabled(f)
}

func setWatchList(t *testing.T, on bool) {
	prev := clientfeatures.FeatureGates()
	clientfeatures.ReplaceFeatureGates(watchListGates{Gates: prev, on: on})
	t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(prev) })
}

// TestViewInformer runs a client-go node informer, as every CCM does, through
// the gate with WatchList on (what current CCMs send) and off (list + watch).
func TestViewInformer(t *testing.T) {
	needEnv(t)
	for _, watchList := range []bool{true, false} {
		name := map[bool]string{true: "watchlist", false: "list-watch"}[watchList]
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			own, foreign := "inf-"+name+"-hc", "inf-"+name+"-aws"
			fixture(t, "inf-"+name,
				gatetest.NodeSpec{Name: own + "-1", Platform: own, ProviderID: "hcloud://1"},
				gatetest.NodeSpec{Name: own + "-2", Platform: own, ProviderID: "hcloud://2"},
				gatetest.NodeSpec{Name: foreign + "-1", Platform: foreign, ProviderID: "aws:///a/i-1"},
				gatetest.NodeSpec{Name: "inf-" + name + "-uninit"},
			)
			setWatchList(t, watchList)
			g := startGate(t, own, nil)

			factory := informers.NewSharedInformerFactory(g.client(t), 0)
			inf := factory.Core().V1().Nodes().Informer()
			stopInformers := make(chan struct{})
			factory.Start(stopInformers)
			defer func() {
				close(stopInformers)
				factory.Shutdown()
			}()
			if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
				t.Fatal("informer never synced through the gate")
			}
			store := func() []string {
				keys := inf.GetStore().ListKeys()
				slices.Sort(keys)
				return keys
			}
			if got := store(); !slices.Equal(got, []string{own + "-1", own + "-2"}) {
				t.Fatalf("informer sees %v", got)
			}

			nodeRequests := g.seen.find(func(u *url.URL) bool { return u.Path == "/api/v1/nodes" })
			streams := slices.ContainsFunc(nodeRequests, func(u *url.URL) bool {
				q := u.Query()
				return q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true" && q.Get("resourceVersionMatch") == "NotOlderThan"
			})
			lists := slices.ContainsFunc(nodeRequests, func(u *url.URL) bool { return u.Query().Get("watch") == "" })
			if watchList && (!streams || lists) {
				t.Fatalf("WatchList on: want one streaming watch and no list, got %v", nodeRequests)
			}
			if !watchList && (streams || !lists) {
				t.Fatalf("WatchList off: want list + watch, got %v", nodeRequests)
			}

			waitStore := func(want ...string) {
				t.Helper()
				slices.Sort(want)
				err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
					return slices.Equal(store(), want), nil
				})
				if err != nil {
					t.Fatalf("informer sees %v, want %v", store(), want)
				}
			}
			relabel := func(node, platform string) {
				t.Helper()
				patch := `{"metadata":{"labels":{"` + platformLabel + `":"` + platform + `"}}}`
				if _, err := env.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			}

			// Relabelling moves a node into the view and out again.
			relabel(foreign+"-1", own)
			waitStore(own+"-1", own+"-2", foreign+"-1")
			relabel(foreign+"-1", foreign)
			waitStore(own+"-1", own+"-2")

			// talos-ccm initializes the uninitialized node: it appears.
			relabel("inf-"+name+"-uninit", own)
			waitStore(own+"-1", own+"-2", "inf-"+name+"-uninit")

			// A new foreign node, then a new own node: when the own node arrives,
			// the foreign one (an earlier event) has been filtered.
			if err := gatetest.CreateNodes(ctx, env.Client,
				gatetest.NodeSpec{Name: foreign + "-2", Platform: foreign, ProviderID: "aws:///a/i-2", Labels: map[string]string{"gatetest": "inf-" + name}},
			); err != nil {
				t.Fatal(err)
			}
			if err := gatetest.CreateNodes(ctx, env.Client,
				gatetest.NodeSpec{Name: own + "-3", Platform: own, ProviderID: "hcloud://3", Labels: map[string]string{"gatetest": "inf-" + name}},
			); err != nil {
				t.Fatal(err)
			}
			waitStore(own+"-1", own+"-2", own+"-3", "inf-"+name+"-uninit")
		})
	}
}

// TestServe runs ccm-gate as its command does: TLS on loopback with a
// self-signed certificate, health and metrics on their own listener.
func TestServe(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	fixture(t, "serve",
		gatetest.NodeSpec{Name: "serve-hc-1", Platform: "serve-hc", ProviderID: "hcloud://1"},
		gatetest.NodeSpec{Name: "serve-aws-1", Platform: "serve-aws", ProviderID: "aws:///a/i-1"},
	)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := gatetest.WriteKubeconfig(ccmConfig, kubeconfig); err != nil {
		t.Fatal(err)
	}
	tlsDir := filepath.Join(dir, "tls")

	run := func() (proxyURL, health, metrics string, stop func()) {
		t.Helper()
		o := proxy.DefaultServerOptions()
		o.Listen, o.HealthListen, o.MetricsListen = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		o.TLSDir, o.Kubeconfig, o.Platform, o.Credentials = tlsDir, kubeconfig, "serve-hc", string(proxy.OwnCredentials)
		sctx, cancel := context.WithCancel(ctx)
		ready := make(chan [3]string, 1)
		done := make(chan error, 1)
		go func() { done <- proxy.Serve(sctx, o, func(p, h, m string) { ready <- [3]string{p, h, m} }) }()
		select {
		case a := <-ready:
			return a[0], a[1], a[2], func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Serve: %v", err)
				}
			}
		case err := <-done:
			cancel()
			t.Fatalf("Serve: %v", err)
		}
		return "", "", "", nil
	}

	proxyURL, health, metrics, stop := run()
	if !strings.HasPrefix(proxyURL, "https://127.0.0.1:") {
		t.Fatalf("proxy URL %s", proxyURL)
	}
	cfg := &rest.Config{Host: proxyURL, TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(tlsDir, proxy.CertFile)}}
	cs := kubernetes.NewForConfigOrDie(cfg)
	l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || !slices.Equal(nodeNames(l.Items), []string{"serve-hc-1"}) {
		t.Fatalf("list over TLS: %v %v", nodeNames(l.Items), err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, _ := rawGet(t, "http://"+health+"/readyz")
		return code == 200, nil
	})
	if err != nil {
		t.Fatal("/readyz never ready")
	}
	if code, body := rawGet(t, "http://"+metrics+"/metrics"); code != 200 || !strings.Contains(body, `ccm_gate_requests_total{decision="filtered",route="nodes"} 1`) {
		t.Fatalf("/metrics %d:\n%s", code, body)
	}
	cert1, _ := os.ReadFile(filepath.Join(tlsDir, proxy.CertFile))
	stop()

	// A restarted gate keeps its certificate: the CCM that trusts it keeps working.
	proxyURL, _, _, stop = run()
	defer stop()
	cert2, _ := os.ReadFile(filepath.Join(tlsDir, proxy.CertFile))
	if string(cert1) != string(cert2) {
		t.Fatal("restart made a new certificate")
	}
	cfg.Host = proxyURL
	if _, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Nodes().Get(ctx, "serve-hc-1", metav1.GetOptions{}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}
