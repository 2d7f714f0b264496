package proxy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
)

var (
	gateBinOnce sync.Once
	gateBin     string
	// gateBinDir holds gateBin; TestMain removes it when every test is done.
	gateBinDir string
	gateBinErr error
)

// startGateBinary runs the real ccm-gate binary (HTTPS, forwarded
// ServiceAccount token) for platform, as the coordinator runs it beside a
// native CCM, and returns it with an HTTP client that trusts it and the CCM's
// token.
func startGateBinary(t *testing.T, platform string, extra ...string) (*gatetest.Gate, *http.Client, string) {
	t.Helper()
	bin := gateBinary(t)
	token, err := gatetest.ServiceAccountToken(context.Background(), env.Client, ccmNamespace, ccmName)
	if err != nil {
		t.Fatal(err)
	}
	upstream := &rest.Config{Host: env.Config.Host, BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}}
	g, err := gatetest.StartGate(bin, t.TempDir(), platform, upstream, token, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	ca, err := os.ReadFile(g.Config.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	return g, hc, token
}

// gateBinary builds cmd/ccm-gate once per test binary.
func gateBinary(t *testing.T) string {
	t.Helper()
	gateBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ccm-gate-bin")
		if err != nil {
			gateBinErr = err
			return
		}
		gateBinDir = dir
		gateBin, gateBinErr = gatetest.BuildGate(dir)
	})
	if gateBinErr != nil {
		t.Fatal(gateBinErr)
	}
	return gateBin
}

// TestGateBinaryDeleteOptions sends DELETEs of own nodes through the real
// ccm-gate with DeleteOptions in the query, in the body or in both. The gate
// forwards every DELETE with a body (its uid/resourceVersion preconditions),
// and the API server reads the query's options only when there is no body: a
// gate that dropped them turned "dry run" into a real delete.
func TestGateBinaryDeleteOptions(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const platform = "delopt-hc"
	var specs []gatetest.NodeSpec
	for _, n := range []string{"dry-query", "dry-body", "dry-grace", "dry-both", "dry-pb", "bad-policy", "conflict", "real", "dry-collection", "dry-patch"} {
		specs = append(specs, gatetest.NodeSpec{Name: "delopt-" + n, Platform: platform, ProviderID: "hcloud://" + n})
	}
	fixture(t, "delopt", specs...)
	g, hc, token := startGateBinary(t, platform)

	// pbDryRun is DeleteOptions{dryRun: [All]} in protobuf, as client-go sends it.
	pbDryRun := func() []byte {
		s := runtime.NewScheme()
		metav1.AddToGroupVersion(s, metav1.SchemeGroupVersion)
		b, err := runtime.Encode(protobuf.NewSerializer(s, s), &metav1.DeleteOptions{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "DeleteOptions"}, DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	tests := []struct {
		name string
		// method, path (under /api/v1/nodes), query, body and its content type
		// of the raw request.
		method, path, query string
		body                string
		contentType         string
		// wantCode is the HTTP status.
		wantCode int
		// wantMessage is a substring of the answer.
		wantMessage string
		// node must still exist afterwards (or be gone).
		node      string
		wantExist bool
	}{
		{name: "dryRun in the query, no body", method: http.MethodDelete, path: "/delopt-dry-query", query: "dryRun=All",
			wantCode: http.StatusOK, node: "delopt-dry-query", wantExist: true},
		{name: "dryRun in the query, empty options in the body", method: http.MethodDelete, path: "/delopt-dry-both", query: "dryRun=All",
			body: `{"kind":"DeleteOptions","apiVersion":"v1"}`, contentType: "application/json",
			wantCode: http.StatusOK, node: "delopt-dry-both", wantExist: true},
		{name: "dryRun in the JSON body", method: http.MethodDelete, path: "/delopt-dry-body",
			body: `{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}`, contentType: "application/json",
			wantCode: http.StatusOK, node: "delopt-dry-body", wantExist: true},
		{name: "dryRun and gracePeriodSeconds in the JSON body", method: http.MethodDelete, path: "/delopt-dry-grace",
			body: `{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":30,"dryRun":["All"]}`, contentType: "application/json",
			wantCode: http.StatusOK, node: "delopt-dry-grace", wantExist: true},
		{name: "dryRun in a protobuf body, gracePeriodSeconds in the query", method: http.MethodDelete, path: "/delopt-dry-pb", query: "gracePeriodSeconds=0",
			body: string(pbDryRun), contentType: "application/vnd.kubernetes.protobuf",
			wantCode: http.StatusOK, node: "delopt-dry-pb", wantExist: true},
		{name: "invalid propagationPolicy in the query reaches validation", method: http.MethodDelete, path: "/delopt-bad-policy", query: "propagationPolicy=Sometimes",
			wantCode: http.StatusUnprocessableEntity, wantMessage: "propagationPolicy", node: "delopt-bad-policy", wantExist: true},
		{name: "query and body disagree", method: http.MethodDelete, path: "/delopt-conflict", query: "gracePeriodSeconds=0",
			body: `{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":30,"dryRun":["All"]}`, contentType: "application/json",
			wantCode: http.StatusBadRequest, wantMessage: "gracePeriodSeconds", node: "delopt-conflict", wantExist: true},
		{name: "deletecollection with dryRun is refused, not forwarded", method: http.MethodDelete, path: "", query: "dryRun=All&labelSelector=gatetest%3Ddelopt",
			wantCode: http.StatusForbidden, node: "delopt-dry-collection", wantExist: true},
		{name: "dry-run merge patch passes unchanged", method: http.MethodPatch, path: "/delopt-dry-patch", query: "dryRun=All",
			body: `{"metadata":{"labels":{"delopt":"patched"}}}`, contentType: "application/merge-patch+json",
			wantCode: http.StatusOK, node: "delopt-dry-patch", wantExist: true},
		{name: "delete without options deletes", method: http.MethodDelete, path: "/delopt-real",
			wantCode: http.StatusOK, node: "delopt-real", wantExist: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url := g.Config.Host + "/api/v1/nodes" + tc.path
			if tc.query != "" {
				url += "?" + tc.query
			}
			req, err := http.NewRequestWithContext(ctx, tc.method, url, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+token)
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != tc.wantCode || !strings.Contains(string(body), tc.wantMessage) {
				t.Errorf("answer %d %s, want %d mentioning %q", resp.StatusCode, body, tc.wantCode, tc.wantMessage)
			}
			n, err := env.Client.CoreV1().Nodes().Get(ctx, tc.node, metav1.GetOptions{})
			switch {
			case tc.wantExist && err != nil:
				t.Fatalf("node %s: %v (the request was not a dry run)", tc.node, err)
			case !tc.wantExist && !apierrors.IsNotFound(err):
				t.Fatalf("node %s still exists: %v", tc.node, err)
			case tc.wantExist && n.Labels["delopt"] != "":
				t.Fatalf("node %s was patched: %v", tc.node, n.Labels)
			}
		})
	}
}

// TestGateBinaryHealthAndMetricsListeners: the probe listener (which the
// kubelet reaches on the pod IP) answers only /livez and /readyz; /metrics is
// on a listener of its own that ccm-gate binds to loopback by default.
func TestGateBinaryHealthAndMetricsListeners(t *testing.T) {
	needEnv(t)
	g, _, _ := startGateBinary(t, "listeners-hc")
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		// url is fetched without credentials.
		url string
		// wantCode and wantBody (substring) are the answer.
		wantCode int
		wantBody string
	}{
		{url: "http://" + g.Health + "/livez", wantCode: http.StatusOK, wantBody: "ok"},
		{url: "http://" + g.Health + "/readyz", wantCode: http.StatusOK, wantBody: "ok"},
		{url: "http://" + g.Health + "/metrics", wantCode: http.StatusNotFound},
		{url: "http://" + g.Metrics + "/metrics", wantCode: http.StatusOK, wantBody: "go_goroutines"},
		{url: "http://" + g.Metrics + "/readyz", wantCode: http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.url, func(t *testing.T) {
			code, body := get(tc.url)
			if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
				t.Fatalf("%d %.200s, want %d with %q", code, body, tc.wantCode, tc.wantBody)
			}
		})
	}
}

// TestDefaultListenersAreLoopback: without flags, ccm-gate serves nothing
// beyond loopback (the sidecar opts the probes into the pod IP).
func TestDefaultListenersAreLoopback(t *testing.T) {
	o := proxy.DefaultServerOptions()
	for name, addr := range map[string]string{"--listen": o.Listen, "--health-listen": o.HealthListen, "--metrics-listen": o.MetricsListen} {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || net.ParseIP(host) == nil || !net.ParseIP(host).IsLoopback() {
			t.Errorf("%s defaults to %q, not a loopback address", name, addr)
		}
	}
}

// TestGateBinaryServices: the real binary with and without
// --load-balancer-class (and --default-load-balancer-class), as the sidecar
// runs it for a NativeCCM with load balancers on and off.
func TestGateBinaryServices(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const ns = "svc-bin"
	serviceFixture(t, ns,
		svcSpec{name: "own", class: ptr.To(ownClass)},
		svcSpec{name: "aws", class: ptr.To(awsClass)},
		svcSpec{name: "classless"},
	)
	tests := []struct {
		name string
		// flags are the gate's extra flags.
		flags []string
		// want are the Services the CCM lists.
		want []string
	}{
		{name: "load balancers off: no Service"},
		{name: "own class", flags: []string{"--load-balancer-class=" + ownClass}, want: []string{ns + "/own"}},
		{name: "own class and the default", flags: []string{"--load-balancer-class=" + ownClass, "--default-load-balancer-class"},
			want: []string{ns + "/classless", ns + "/own"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, _, _ := startGateBinary(t, "svc-bin-hc", tc.flags...)
			for ctName, ct := range contentTypes {
				cfg := rest.CopyConfig(g.Config)
				cfg.ContentType = ct
				l, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatalf("%s: %v", ctName, err)
				}
				noClass(t, l.Items...)
				if got := serviceNames(l.Items); !slices.Equal(got, tc.want) && len(got)+len(tc.want) > 0 {
					t.Fatalf("%s: %v, want %v", ctName, got, tc.want)
				}
			}
		})
	}
}

// TestGateBinaryRefusesUpgrades (security round three, hole 3): the API
// server serves watches over WebSocket, and a gate that relayed its 101
// raw showed a CCM every Service. The real binary refuses every protocol
// switch on every route (Services, nodes, anything else) over HTTP/1.1,
// and plain HTTP/2 (what client-go negotiates) still sees only the view.
func TestGateBinaryRefusesUpgrades(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const ns = "svc-upgrade"
	serviceFixture(t, ns,
		svcSpec{name: "own", class: ptr.To(ownClass)},
		svcSpec{name: "aws", class: ptr.To(awsClass), labels: map[string]string{"canary": foreignCanary}},
	)
	g, hc, token := startGateBinary(t, "upgrade-hc", "--load-balancer-class="+ownClass)
	base := g.Config.Host
	for _, path := range []string{
		"/api/v1/services?watch=true",
		"/api/v1/namespaces/" + ns + "/services",
		"/api/v1/namespaces/" + ns + "/services/aws",
		"/api/v1/watch/nodes",
		"/api/v1/nodes?watch=true",
		"/api/v1/namespaces/" + ns + "/pods/p/exec?command=sh",
	} {
		for name, h := range upgradeHeaders {
			t.Run(name+" "+path, func(t *testing.T) {
				// a switched connection relayed raw stays open: read it for a while
				ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer "+token)
				for k, vs := range h {
					req.Header[k] = vs
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = resp.Body.Close() }()
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
				if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "not served") {
					t.Fatalf("%s: answer %d, want the gate's refusal (403): %.300s", resp.Proto, resp.StatusCode, body)
				}
				if strings.Contains(string(body), foreignCanary) {
					t.Fatalf("the refusal carries a Service outside the view: %.300s", body)
				}
			})
		}
	}

	// HTTP/2 itself is no upgrade: a list over it shows the view.
	h2 := &http.Client{Transport: hc.Transport.(*http.Transport).Clone()}
	h2.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/namespaces/"+ns+"/services", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := h2.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK || strings.Contains(string(body), foreignCanary) || !strings.Contains(string(body), `"own"`) {
		t.Fatalf("HTTP/2 list: %s %d: %.300s", resp.Proto, resp.StatusCode, body)
	}
}
