package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
)

// form is what tells the answers to a GET of a node in different forms
// apart: status, Content-Type, kind, and whether JSON is indented.
func form(code int, contentType string, body []byte) string {
	b := string(body)
	kind := "?"
	for _, k := range []string{"Table", "PartialObjectMetadata", "Node", "Status"} {
		if strings.Contains(b, `"kind":"`+k+`"`) || strings.Contains(b, `"kind": "`+k+`"`) || strings.Contains(b, "kind: "+k+"\n") {
			kind = k
			break
		}
	}
	if strings.HasPrefix(b, "k8s\x00") {
		kind = "protobuf"
	}
	return strings.Join([]string{http.StatusText(code), contentType, kind, map[bool]string{true: "indented", false: "compact"}[strings.Contains(b, "\n    ")]}, " | ")
}

// TestViewNodeReadFormAsTheAPIServer: a GET of a node in the view is
// answered in the form the API server gives the client's Accept header, for
// headers that the API server reads otherwise than mime.ParseMediaType does
// (TestPlainPreferredAsTheAPIServer). The gate used to answer a plain Node
// to all of those that it took for a plain preference.
func TestViewNodeReadFormAsTheAPIServer(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const group = "asapi"
	platform := group + "-aws"
	name := group + "-a"
	fixture(t, group, gatetest.NodeSpec{Name: name, Platform: platform, ProviderID: "aws:///eu-west-1a/i-1"})
	tr, err := rest.TransportFor(ccmConfig)
	if err != nil {
		t.Fatal(err)
	}
	direct := strings.TrimSuffix(ccmConfig.Host, "/")
	g := startGate(t, platform, nil)
	get := func(base string, rt http.RoundTripper, accept []string) string {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/nodes/"+name, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header["Accept"] = accept
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return form(resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	const table = "application/json;as=Table;g=meta.k8s.io;v=v1"
	for _, accept := range [][]string{
		{"*/*, " + table + ";q=0.5"},
		{"application/*, " + table + ";q=0.5"},
		{"*/*;q=1, application/vnd.kubernetes.protobuf;q=0.5"},
		{"Application/JSON, " + table + ";q=0.5"},
		{table + ";Q=0.1, application/json;q=0.5"},
		{table + ";q=0.5,\tapplication/json"},
		{table + ";q=0.5", "application/json"},
		{table + ";q=0.5, application/json;q=0.50000001"},
		{table + ";q=NaN, application/json;q=0.5"},
		{"application/json;q= 0.9, " + table + ";q=0.5"},
		{`application/json;q="0.9", ` + table + ";q=0.5"},
		{"application/json;stream=x, " + table + ";q=0.5"},
		{"application/json;pretty=1"},
		// the gate's plain picks that are right
		{"application/vnd.kubernetes.protobuf, */*"},
		{"application/json, */*"},
		{"application/json;charset=utf-8, " + table + ";q=0.5"},
		{"application/json;q=1.000, " + table + ";q=0.0001"},
		{"application/json ; q=1, " + table + ";q=0.5"},
		{table + ";q=0, application/json;q=0"},
		{"application/json;v=v1;g=meta.k8s.io;as=Table"},
		{"application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1, application/json;q=0.5"},
	} {
		want := get(direct, tr, accept)
		if got := get(g.url, http.DefaultTransport, accept); got != want {
			t.Errorf("Accept %q: the gate answered\n  %s\nthe API server\n  %s", accept, got, want)
		}
	}
}

// TestViewHeldReadQuery: whatever the query of a held GET spells a
// resourceVersion with (repeated, escaped, next to resourceVersionMatch,
// watch or a parameter Go cannot parse), the API server is asked without
// one, as it reads the query (url.ParseQuery): with one, it may answer from
// its watch cache with the node as it was before the gate's read, perhaps
// outside the view. A GET of one node with watch=1 is a GET at the API
// server, not a watch.
func TestViewHeldReadQuery(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const group = "heldq"
	platform := group + "-aws"
	name := group + "-a"
	fixture(t, group, gatetest.NodeSpec{Name: name, Platform: platform, ProviderID: "aws:///eu-west-1a/i-1"})
	queries := make(chan string, 1)
	relay := startRelay(t, func(r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+name && r.Header.Get("Accept") != gateCheck {
			queries <- r.URL.RawQuery
		}
	})
	g := startGate(t, platform, func(c *proxy.Config) { c.Upstream = &rest.Config{Host: relay} })
	for _, q := range []string{
		"resourceVersion=0",
		"resourceVersion=0&resourceVersion=1",
		"%72esourceVersion=0",
		"resource%56ersion=0",
		"resourceVersion=0&resourceVersionMatch=NotOlderThan",
		"watch=1&resourceVersion=0&timeoutSeconds=5&allowWatchBookmarks=true",
		"resourceVersion=0&bad=%zz",
		"resourceVersion=0;x=1",
		"pretty=1&dryRun=All&fieldManager=x&resourceVersion=1",
	} {
		got := getNode(t, ctx, g, "/api/v1/nodes/"+name+"?"+q, acceptTable)
		var fwd string
		select {
		case fwd = <-queries:
		default:
			t.Errorf("?%s: no GET forwarded (%d %.200q)", q, got.code, got.body)
			continue
		}
		v, _ := url.ParseQuery(fwd)
		if v.Has("resourceVersion") || got.code != http.StatusOK || !strings.Contains(strings.ReplaceAll(got.body, " ", ""), `"kind":"Table"`) {
			t.Errorf("?%s: forwarded as ?%s (resourceVersion %q), answered %d %.200q", q, fwd, v["resourceVersion"], got.code, got.body)
		}
	}
}

// TestViewNodeRecreatedDuringOtherRead: a node deleted and created again
// with the same name while a held read is under way (a new uid, and a
// resourceVersion of its own) is not shown as the node in between was: the
// API server answers the GET with the node recreated in another domain, and
// the node is back in the view, recreated once more, before the gate's read
// after the answer. The answer is dropped and the GET forwarded again.
func TestViewNodeRecreatedDuringOtherRead(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const group = "recreated"
	platform := group + "-aws"
	name := group + "-a"
	spec := func(region string) gatetest.NodeSpec {
		return gatetest.NodeSpec{Name: name, Platform: platform, ProviderID: "aws:///" + region + "a/i-1",
			Labels: map[string]string{regionLabel: region, "gatetest": group}}
	}
	fixture(t, group, spec("eu-west-1"))
	recreate := func(ctx context.Context, region string) {
		if err := env.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
		if err := gatetest.CreateNodes(ctx, env.Client, spec(region)); err != nil {
			t.Error(err)
		}
	}
	// step 1: the forwarded GET sees the node recreated in us-east-1; step
	// 2: the gate's next read sees it recreated in eu-west-1
	var step atomic.Int32
	relay := startRelay(t, func(r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/api/v1/nodes/"+name {
			return
		}
		switch {
		case r.Header.Get("Accept") != gateCheck && step.CompareAndSwap(1, 2):
			recreate(r.Context(), "us-east-1")
		case r.Header.Get("Accept") == gateCheck && step.CompareAndSwap(2, 3):
			recreate(r.Context(), "eu-west-1")
		}
	})
	g := startGate(t, platform, func(c *proxy.Config) {
		c.Upstream = &rest.Config{Host: relay}
		c.DomainSelector = regionLabel + "=eu-west-1"
	})
	for _, accept := range []string{acceptTable, "application/yaml", acceptMetadata} {
		step.Store(1)
		got := getNode(t, ctx, g, "/api/v1/nodes/"+name, accept)
		if step.Load() != 3 {
			t.Fatalf("Accept %s: the node was not recreated twice (step %d)", accept, step.Load())
		}
		n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.code != http.StatusOK || strings.Contains(got.body, "us-east-1") || !strings.Contains(got.body, string(n.UID)) {
			t.Errorf("Accept %s: %d %.300q, want the node recreated in the view (uid %s)", accept, got.code, got.body, n.UID)
		}
	}
}
