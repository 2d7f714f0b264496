package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
)

// nodeGet is a raw GET of path through g with the Accept header accept.
type nodeGet struct {
	code   int
	header http.Header
	body   string
}

func getNode(t *testing.T, ctx context.Context, g *gate, path, accept string) nodeGet {
	t.Helper()
	var h []string
	if accept != "" {
		h = []string{accept}
	}
	return roundTripGet(t, ctx, roundTripFunc(http.DefaultClient.Do), g.url+path, h)
}

// roundTripGet is a raw GET of url through rt with the Accept headers accept
// (none for nil).
func roundTripGet(t *testing.T, ctx context.Context, rt http.RoundTripper, url string, accept []string) nodeGet {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != nil {
		req.Header["Accept"] = accept
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return nodeGet{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

// viewTest begins a test of reads of group's nodes through the gate: it is
// skipped without a control plane and has a minute; the nodes' platform is
// group-aws.
func viewTest(t *testing.T, group string) (ctx context.Context, platform string) {
	t.Helper()
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx, group + "-aws"
}

// oneNodeTest is viewTest with one node in the view, group-a (eu-west-1a).
func oneNodeTest(t *testing.T, group string) (ctx context.Context, platform, name string) {
	t.Helper()
	ctx, platform = viewTest(t, group)
	name = group + "-a"
	fixture(t, group, gatetest.NodeSpec{Name: name, Platform: platform, ProviderID: "aws:///eu-west-1a/i-1"})
	return ctx, platform, name
}

// movingNodeTest is viewTest with one node, group-a, labeled with the region
// eu-west-1; relabel gives it another region (a test's error if it cannot).
func movingNodeTest(t *testing.T, group string) (ctx context.Context, platform, name string, relabel func(ctx context.Context, region string)) {
	t.Helper()
	ctx, platform = viewTest(t, group)
	name = group + "-a"
	fixture(t, group, inRegion(name, platform, "eu-west-1", 1))
	relabel = func(ctx context.Context, region string) {
		if err := setRegion(ctx, name, region); err != nil {
			t.Error(err)
		}
	}
	return ctx, platform, name, relabel
}

// setRegion labels the node name with region.
func setRegion(ctx context.Context, name, region string) error {
	_, err := env.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+regionLabel+`":"`+region+`"}}}`), metav1.PatchOptions{})
	return err
}

// inRegion is the node name of platform in region (its zone a), the EC2
// instance i-<i>.
func inRegion(name, platform, region string, i int) gatetest.NodeSpec {
	return gatetest.NodeSpec{Name: name, Platform: platform, ProviderID: fmt.Sprintf("aws:///%sa/i-%d", region, i),
		Labels: map[string]string{regionLabel: region}}
}

// shape is what tells two answers apart, the node's name aside.
func (a nodeGet) shape(name string) string {
	var keys []string
	for k := range a.header {
		if k != "Date" && k != "Audit-Id" && !strings.HasPrefix(k, "X-Kubernetes-Pf-") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return strings.Join([]string{
		http.StatusText(a.code), a.header.Get("Content-Type"), strings.Join(keys, ","),
		strings.ReplaceAll(a.body, name, "NAME"),
	}, " | ")
}

// TestViewNotFoundAlike: the 404 of a node outside the view and that of a
// node that does not exist are the same answer, whatever the node cache
// holds and whatever the encoding the client asks for. The API server's own
// 404 differs from the gate's (protobuf for a protobuf client, a trailing
// newline, its own headers): relayed, it told a CCM that a node it cannot see
// does not exist, and so that the others it cannot see do.
func TestViewNotFoundAlike(t *testing.T) {
	const group = "alike"
	ctx, platform := viewTest(t, group)
	n := func(s string) string { return group + "-" + s }
	fixture(t, group,
		inRegion(n("eu"), platform, "eu-west-1", 1),
		inRegion(n("left"), platform, "us-east-1", 2),
		inRegion(n("us"), platform, "us-east-1", 3),
	)
	for _, cached := range []bool{true, false} {
		g := startGate(t, platform, func(c *proxy.Config) {
			c.DomainSelector = regionLabel + "=eu-west-1"
			c.DisableCache = !cached
		})
		hidden := []string{n("us"), n("nothere")}
		if cached {
			// The cache is behind: it still holds a node that left the view
			// and one that was deleted.
			inView := map[string]string{platformLabel: platform, regionLabel: "eu-west-1"}
			for _, name := range []string{n("left"), n("gone")} {
				if err := proxy.SetCachedNode(g.proxy, name, inView); err != nil {
					t.Fatal(err)
				}
			}
			hidden = append(hidden, n("left"), n("gone"))
		}
		for _, accept := range []string{"", "application/json", "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf,application/json", "application/yaml", "application/json;as=Table;v=v1;g=meta.k8s.io"} {
			var want string
			for _, name := range hidden {
				got := getNode(t, ctx, g, "/api/v1/nodes/"+name, accept).shape(name)
				if want == "" {
					want = got
					if !strings.HasPrefix(got, "Not Found |") {
						t.Errorf("cached %v, Accept %q, %s: %s, want 404", cached, accept, name, got)
					}
					continue
				}
				if got != want {
					t.Errorf("cached %v, Accept %q: %s is answered\n  %s\nbut %s\n  %s", cached, accept, name, got, hidden[0], want)
				}
			}
		}
	}
}

// startRelay starts a proxy in front of the API server that authenticates as
// the CCM and calls before on every request before it forwards it: a test
// changes the cluster between the gate's requests with it.
func startRelay(t *testing.T, before func(r *http.Request)) string {
	t.Helper()
	tr, err := rest.TransportFor(ccmConfig)
	if err != nil {
		t.Fatal(err)
	}
	up, err := url.Parse(ccmConfig.Host)
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(up) }, Transport: tr, FlushInterval: -1}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		before(r)
		rp.ServeHTTP(w, r)
	}))
	// registered before the gate's: closed after the gate stopped
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL
}

// TestViewNodeLeavesDuringGet: a node that leaves the view between the
// gate's check and the API server's answer to the GET is not shown: the
// answer is checked, whether the node cache holds the node, misses it (a
// node that has just joined the view), or is off (--cache=false).
func TestViewNodeLeavesDuringGet(t *testing.T) {
	ctx, platform, name, relabel := movingNodeTest(t, "leaves")
	// armed: the next GET of the node itself (not the gate's metadata-only
	// check) moves the node to another region before the API server reads it
	var armed atomic.Bool
	relay := startRelay(t, func(r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+name &&
			!strings.Contains(r.Header.Get("Accept"), "as=PartialObjectMetadata") && armed.CompareAndSwap(true, false) {
			relabel(r.Context(), "us-east-1")
		}
	})
	for _, tc := range []struct {
		name  string
		cache bool
		drop  bool
	}{{"cache off", false, false}, {"cache miss", true, true}, {"cache hit", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			relabel(ctx, "eu-west-1")
			g := startGate(t, platform, func(c *proxy.Config) {
				c.Upstream = &rest.Config{Host: relay}
				c.DomainSelector = regionLabel + "=eu-west-1"
				c.DisableCache = !tc.cache
			})
			for _, accept := range []string{"application/json", "application/vnd.kubernetes.protobuf"} {
				relabel(ctx, "eu-west-1")
				if tc.cache {
					// the cache hears of the relabel first, then is set
					time.Sleep(200 * time.Millisecond)
					inView := map[string]string{platformLabel: platform, regionLabel: "eu-west-1"}
					var err error
					if tc.drop {
						err = proxy.DropCachedNode(g.proxy, name)
					} else {
						err = proxy.SetCachedNode(g.proxy, name, inView)
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				armed.Store(true)
				got := getNode(t, ctx, g, "/api/v1/nodes/"+name, accept)
				if armed.Load() {
					t.Fatalf("Accept %s: the relay saw no GET of the node", accept)
				}
				if got.code != http.StatusNotFound || strings.Contains(got.body, "us-east-1") {
					t.Errorf("Accept %s: the node left the view before the API server read it, the gate answered %d %q", accept, got.code, got.body)
				}
			}
		})
	}
}

// Accept headers of clients that prefer another form than a plain Node.
const (
	acceptTable    = "application/json;as=Table;v=v1;g=meta.k8s.io"
	acceptKubectl  = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
	acceptMetadata = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
	// gateCheck is the Accept header of the gate's own read of a node.
	gateCheck = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

// TestViewNodeLeavesDuringOtherRead is TestViewNodeLeavesDuringGet for the
// reads whose answer the gate does not decode (as=Table,
// as=PartialObjectMetadata, YAML, and headers that prefer them to a plain
// Node): a relabel between the gate's read of the node before the GET and
// the API server's answer is not shown, the gate answers its own 404, the
// same as for a node that does not exist. Before the answer was held for a
// read of the node after it, the gate showed the node in its new domain.
// The forwarded GET carries no resourceVersion: with one, the API server
// may answer from its watch cache, with the node as it was before the gate's
// read of it.
func TestViewNodeLeavesDuringOtherRead(t *testing.T) {
	ctx, platform, name, relabel := movingNodeTest(t, "leaves2")
	var (
		armed atomic.Bool
		// query is that of the last GET of the node the relay forwarded
		query atomic.Value
	)
	relay := startRelay(t, func(r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+name && r.Header.Get("Accept") != gateCheck {
			query.Store(r.URL.RawQuery)
			if armed.CompareAndSwap(true, false) {
				relabel(r.Context(), "us-east-1")
			}
		}
	})
	for _, cached := range []bool{true, false} {
		g := startGate(t, platform, func(c *proxy.Config) {
			c.Upstream = &rest.Config{Host: relay}
			c.DomainSelector = regionLabel + "=eu-west-1"
			c.DisableCache = !cached
		})
		for _, accept := range []string{
			"application/yaml",
			"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
			"application/json;as=Table;g=meta.k8s.io;v=v1",
			acceptKubectl,
			acceptMetadata,
		} {
			want := getNode(t, ctx, g, "/api/v1/nodes/leaves2-nothere", accept).shape("leaves2-nothere")
			for _, q := range []string{"", "?resourceVersion=0"} {
				relabel(ctx, "eu-west-1")
				armed.Store(true)
				got := getNode(t, ctx, g, "/api/v1/nodes/"+name+q, accept)
				if armed.Load() {
					t.Fatalf("Accept %s: the relay saw no GET of the node", accept)
				}
				if got.code != http.StatusNotFound || strings.Contains(got.body, "us-east-1") {
					t.Errorf("cached %v, Accept %s%s: the node left the view before the API server read it, the gate answered %d %.300q", cached, accept, q, got.code, got.body)
				} else if s := got.shape(name); s != want {
					t.Errorf("cached %v, Accept %s%s: the node that left the view is answered\n  %s\nbut one that does not exist\n  %s", cached, accept, q, s, want)
				}
				if fwd, _ := query.Load().(string); strings.Contains(fwd, "resourceVersion") {
					t.Errorf("cached %v, Accept %s%s: the GET was forwarded with %q: the API server may answer it from its watch cache", cached, accept, q, fwd)
				}
			}
		}
	}
}

// TestViewNodeChangesDuringOtherRead: a held read of a node that changes
// between the gate's reads but stays in the view is forwarded again; the
// answer of an attempt in which the node changed is never shown, and a node
// that changes on every attempt is answered 503 with Retry-After (client-go
// reads again), naming the node.
func TestViewNodeChangesDuringOtherRead(t *testing.T) {
	ctx, platform, name := oneNodeTest(t, "changes")
	var (
		// changes is how many of the next forwarded GETs of the node change it
		changes atomic.Int32
		// gets counts the forwarded GETs of the node, seq the changes
		gets, seq atomic.Int32
	)
	relay := startRelay(t, func(r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/api/v1/nodes/"+name || r.Header.Get("Accept") == gateCheck {
			return
		}
		gets.Add(1)
		if changes.Add(-1) >= 0 {
			// the GET shows this change; the gate's read before it did not
			mark := fmt.Sprintf("mark-%d", seq.Add(1))
			if _, err := env.Client.CoreV1().Nodes().Patch(r.Context(), name, types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"gatetest/mark":"`+mark+`"}}}`), metav1.PatchOptions{}); err != nil {
				t.Error(err)
			}
		}
	})
	g := startGate(t, platform, func(c *proxy.Config) { c.Upstream = &rest.Config{Host: relay} })
	for _, tc := range []struct {
		changes   int32
		wantCode  int
		wantGets  int32
		wantInAns string
	}{
		{changes: 0, wantCode: http.StatusOK, wantGets: 1, wantInAns: `"kind":"Table"`},
		{changes: 1, wantCode: http.StatusOK, wantGets: 2, wantInAns: `"kind":"Table"`},
		{changes: 2, wantCode: http.StatusOK, wantGets: 3, wantInAns: `"kind":"Table"`},
		{changes: 3, wantCode: http.StatusServiceUnavailable, wantGets: 3, wantInAns: "changed during the read"},
		{changes: 10, wantCode: http.StatusServiceUnavailable, wantGets: 3, wantInAns: "changed during the read"},
	} {
		changes.Store(tc.changes)
		gets.Store(0)
		got := getNode(t, ctx, g, "/api/v1/nodes/"+name, acceptTable)
		if got.code != tc.wantCode || !strings.Contains(got.body, tc.wantInAns) || gets.Load() != tc.wantGets {
			t.Errorf("%d changes: %d after %d GETs %.300q, want %d after %d GETs with %s", tc.changes, got.code, gets.Load(), got.body, tc.wantCode, tc.wantGets, tc.wantInAns)
			continue
		}
		if got.code != http.StatusOK {
			if got.header.Get("Retry-After") == "" || !strings.Contains(got.body, name) || strings.Contains(got.body, "mark-") {
				t.Errorf("%d changes: %v %q, want Retry-After and the node's name, and nothing of the node", tc.changes, got.header, got.body)
			}
			continue
		}
		// the answer shows the node as the gate's last two reads saw it
		n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got.body, `"resourceVersion":"`+n.ResourceVersion+`"`) {
			t.Errorf("%d changes: the answer is not of the node's current version %s: %.500q", tc.changes, n.ResourceVersion, got.body)
		}
	}
	changes.Store(0)
}

// TestViewNodeReadKeepsItsForm: a client that prefers a Table or
// PartialObjectMetadata and accepts a plain object after it (kubectl get
// node, client-go's metadata client) gets what the API server would answer
// it, as a client that accepts only the Table does. The gate used to answer
// a plain Node: it picked the first plain encoding it could check and asked
// the API server for that only. Such reads are now forwarded with the
// client's Accept header and held (TestViewNodeLeavesDuringOtherRead).
func TestViewNodeReadKeepsItsForm(t *testing.T) {
	ctx, platform, name := oneNodeTest(t, "form")
	g := startGate(t, platform, nil)
	for accept, kind := range map[string]string{
		acceptKubectl:  `"kind":"Table"`,
		acceptMetadata: "PartialObjectMetadata",
		// a plain Node preferred: checked by its answer, as asked
		"application/json, application/yaml;q=0.5":             `"kind":"Node"`,
		"application/vnd.kubernetes.protobuf;q=0.9, */*;q=0.1": "k8s\x00",
	} {
		got := getNode(t, ctx, g, "/api/v1/nodes/"+name, accept)
		if got.code != http.StatusOK || !strings.Contains(got.body, kind) {
			t.Errorf("Accept %s: %d %.200q, want a %s", accept, got.code, got.body, kind)
		}
	}
}

// TestViewAnswerRefused: an answer the gate reads whole to check it (a Node,
// a Service) but that is too large, or not in the encoding asked for, or not
// decodable, is answered 502 saying so, not that the API server is
// unreachable.
func TestViewAnswerRefused(t *testing.T) {
	ctx, platform, name := oneNodeTest(t, "refused")
	const svcPath = "/api/v1/namespaces/default/services/refused"
	// replace is the answer the API server gives to the next GET of the node
	// or the Service (not the gate's own read)
	type fake struct {
		code              int
		contentType, body string
	}
	var replace atomic.Pointer[fake]
	// throttleAfter: the gate's read of the node after a held answer is
	// answered 429, and that is what its client gets
	var throttleAfter, throttled atomic.Bool
	const throttle = `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"slow down","reason":"TooManyRequests","code":429}`
	upstream := rest.CopyConfig(ccmConfig)
	upstream.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+name && throttleAfter.Load() {
				if r.Header.Get("Accept") != gateCheck {
					throttled.Store(true)
				} else if throttled.CompareAndSwap(true, false) {
					return &http.Response{
						StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
						Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(throttle)),
						ContentLength: int64(len(throttle)), Request: r,
					}, nil
				}
			}
			f := replace.Load()
			if f == nil || r.Method != http.MethodGet || r.Header.Get("Accept") == gateCheck ||
				(r.URL.Path != "/api/v1/nodes/"+name && r.URL.Path != svcPath) {
				return rt.RoundTrip(r)
			}
			return &http.Response{
				StatusCode: f.code, Status: fmt.Sprintf("%d %s", f.code, http.StatusText(f.code)), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{"Content-Type": {f.contentType}}, Body: io.NopCloser(strings.NewReader(f.body)),
				ContentLength: -1, Request: r,
			}, nil
		})
	}
	g := startGate(t, platform, func(c *proxy.Config) {
		c.Upstream = upstream
		c.LoadBalancerClass = ownClass
	})
	large := `{"kind":"Node","apiVersion":"v1","metadata":{"name":"` + name + `","annotations":{"x":"` + strings.Repeat("x", 9<<20) + `"}}}`
	for _, tc := range []struct {
		what, path, accept, contentType, body, want string
		code                                        int
	}{
		{"node too large", "/api/v1/nodes/" + name, "application/json", "application/json", large, "too large", 0},
		{"node too large, held", "/api/v1/nodes/" + name, acceptTable, "application/json", large, "too large", 0},
		{"node in another encoding", "/api/v1/nodes/" + name, "application/json", "text/plain", `{"kind":"Node"}`, "cannot decode", 0},
		{"node not decodable", "/api/v1/nodes/" + name, "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf", "k8s\x00garbage", "cannot decode", 0},
		{"Service too large", svcPath, "application/json", "application/json", strings.Replace(large, `"Node"`, `"Service"`, 1), "too large", 0},
		{"Service in another encoding", svcPath, "application/json", "text/html", "<html></html>", "cannot decode", 0},
		{"Service not decodable", svcPath, "application/json", "application/json", "{", "cannot decode", 0},
		// neither a Node nor an error: not relayed raw
		{"node with another status", "/api/v1/nodes/" + name, "application/json", "application/json", `{"kind":"Node"}`, "203 Non-Authoritative Information", http.StatusNonAuthoritativeInfo},
		{"node with another status, held", "/api/v1/nodes/" + name, acceptTable, "application/json", `{"kind":"Table"}`, "203 Non-Authoritative Information", http.StatusNonAuthoritativeInfo},
	} {
		if tc.code == 0 {
			tc.code = http.StatusOK
		}
		replace.Store(&fake{code: tc.code, contentType: tc.contentType, body: tc.body})
		got := getNode(t, ctx, g, tc.path, tc.accept)
		replace.Store(nil)
		if got.code != http.StatusBadGateway || !strings.Contains(got.body, tc.want) || strings.Contains(got.body, "unreachable") {
			t.Errorf("%s: %d %.300q, want 502 saying %q", tc.what, got.code, got.body, tc.want)
		}
	}
	throttleAfter.Store(true)
	got := getNode(t, ctx, g, "/api/v1/nodes/"+name, acceptTable)
	throttleAfter.Store(false)
	if got.code != http.StatusTooManyRequests || got.body != throttle {
		t.Errorf("the read after a held answer answered 429: the gate answered %d %.300q, want that 429", got.code, got.body)
	}
}
