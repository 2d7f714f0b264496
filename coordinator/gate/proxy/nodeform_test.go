package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
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
func (a nodeGet) form() string {
	b := a.body
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
	return strings.Join([]string{http.StatusText(a.code), a.header.Get("Content-Type"), kind, map[bool]string{true: "indented", false: "compact"}[strings.Contains(b, "\n    ")]}, " | ")
}

// TestViewNodeReadFormAsTheAPIServer: a GET of a node in the view is
// answered in the form the API server gives the client's Accept header, for
// headers that the API server reads otherwise than mime.ParseMediaType does
// (TestPlainPreferredAsTheAPIServer). The gate used to answer a plain Node
// to all of those that it took for a plain preference.
func TestViewNodeReadFormAsTheAPIServer(t *testing.T) {
	ctx, platform, name := oneNodeTest(t, "asapi")
	tr, err := rest.TransportFor(ccmConfig)
	if err != nil {
		t.Fatal(err)
	}
	direct := strings.TrimSuffix(ccmConfig.Host, "/")
	g := startGate(t, platform, nil)
	get := func(base string, rt http.RoundTripper, accept []string) string {
		return roundTripGet(t, ctx, rt, base+"/api/v1/nodes/"+name, accept).form()
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
		{"application/*"},
		{"application/*;q=0.1, text/html"},
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
	ctx, platform, name := oneNodeTest(t, "heldq")
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
	const group = "recreated"
	ctx, platform := viewTest(t, group)
	name := group + "-a"
	spec := func(region string) gatetest.NodeSpec {
		s := inRegion(name, platform, region, 1)
		s.Labels["gatetest"] = group
		return s
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

// TestViewHeldAnswersMemory: the answers the gate holds whole (a held read
// waits with its answer for the gate's read after it; a checked one until it
// is written to the client) are bounded together, not only each (8 MiB):
// a client's many reads of a large node at once never make the gate hold
// more than its budget of answers; the reads beyond it are answered 429 with
// Retry-After (client-go reads again), and the budget is whole again once
// the answers are written. Without the bound, 12 held answers of 6 MiB made
// the gate hold 72 MiB at once, above the gate container's memory limit
// (64 MiB): a CCM took its gate down (OOM) with reads of a node of its own
// view, made large (annotations, status) by writes it may make. A read
// beyond the budget of a node that has left the view is the gate's 404, as
// for a node that does not exist: a 429 would say that it still exists.
func TestViewHeldAnswersMemory(t *testing.T) {
	const group = "memory"
	ctx, platform := viewTest(t, group)
	n := func(s string) string { return group + "-" + s }
	fixture(t, group,
		inRegion(n("a"), platform, "eu-west-1", 1),
		inRegion(n("leaves"), platform, "eu-west-1", 2),
	)
	const (
		reads = 12
		size  = 6 << 20
		// budget is the most the gate may hold of these answers at once
		budget = 32 << 20
	)
	large := `{"kind":"Table","apiVersion":"meta.k8s.io/v1","rows":[],"x":"` + strings.Repeat("x", size) + `"}`
	var (
		mu sync.Mutex
		// read: the client requests (by User-Agent) whose answer the gate
		// has read whole; held, how many of them wait in the gate's read
		// after the answer until release
		read           = map[string]bool{}
		held, mostHeld int
		release        = make(chan struct{})
		releaseOnce    sync.Once
		heldNow        = make(chan struct{}, reads)
		unblock        = func() { releaseOnce.Do(func() { close(release) }) }
	)
	defer unblock()
	upstream := rest.CopyConfig(ccmConfig)
	upstream.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/api/v1/nodes/"+group) {
				return rt.RoundTrip(r)
			}
			ua := strings.TrimSuffix(r.Header.Get("User-Agent"), " (ccm-gate check)")
			if r.Header.Get("Accept") != gateCheck {
				if r.URL.Path == "/api/v1/nodes/"+n("leaves") {
					// the node leaves the view before the API server answers
					if err := setRegion(r.Context(), n("leaves"), "us-east-1"); err != nil {
						t.Error(err)
					}
				}
				body := &eofReader{r: strings.NewReader(large), eof: func() {
					mu.Lock()
					read[ua] = true
					mu.Unlock()
				}}
				return &http.Response{
					StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
					Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(body),
					ContentLength: int64(len(large)), Request: r,
				}, nil
			}
			mu.Lock()
			after := read[ua]
			if after {
				held++
				mostHeld = max(mostHeld, held)
			}
			mu.Unlock()
			if after {
				heldNow <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
				}
				mu.Lock()
				held--
				mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	}
	g := startGate(t, platform, func(c *proxy.Config) {
		c.Upstream = upstream
		c.DomainSelector = regionLabel + "=eu-west-1"
	})
	get := func(name, ua string) nodeGet {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url+"/api/v1/nodes/"+name, nil)
		if err != nil {
			t.Error(err)
			return nodeGet{}
		}
		req.Header.Set("Accept", acceptTable)
		req.Header.Set("User-Agent", ua)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nodeGet{body: err.Error()}
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return nodeGet{code: resp.StatusCode, header: resp.Header, body: string(b[:min(len(b), 300)])}
	}
	codes := make(chan nodeGet, reads)
	for i := range reads {
		go func() { codes <- get(n("a"), fmt.Sprintf("read-%d", i)) }()
	}
	// every read is either held (its answer read whole, the gate's read
	// after it waiting) or answered
	var answered []nodeGet
	for heldReads := 0; heldReads+len(answered) < reads; {
		select {
		case <-heldNow:
			heldReads++
		case a := <-codes:
			answered = append(answered, a)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d reads held, %d answered, of %d", heldReads, len(answered), reads)
		}
	}
	mu.Lock()
	most := mostHeld
	mu.Unlock()
	if most*size > budget {
		t.Errorf("the gate held %d answers of %d MiB at once: %d MiB, more than %d MiB", most, size>>20, most*size>>20, budget>>20)
	}
	for _, a := range answered {
		if a.code != http.StatusTooManyRequests || a.header.Get("Retry-After") == "" {
			t.Errorf("a read beyond the budget: %d %v %q, want 429 with Retry-After", a.code, a.header, a.body)
		}
	}
	if len(answered) > 0 {
		// the budget is taken: a node that leaves the view during its GET
		// is 404 as one that does not exist
		want := getNode(t, ctx, g, "/api/v1/nodes/"+n("nothere"), acceptTable).shape(n("nothere"))
		if got := get(n("leaves"), "leaves").shape(n("leaves")); got != want {
			t.Errorf("a node that left the view, its answer beyond the budget, is answered\n  %s\nbut one that does not exist\n  %s", got, want)
		}
	}
	unblock()
	for range reads - len(answered) {
		if a := <-codes; a.code != http.StatusOK {
			t.Errorf("a held read: %d %q, want 200", a.code, a.body)
		}
	}
	if !proxy.AnswersIdle(g.proxy) {
		t.Errorf("the gate still holds answers after all were written")
	}
}

// eofReader calls eof once its last byte is read.
type eofReader struct {
	r    *strings.Reader
	eof  func()
	once sync.Once
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if e.r.Len() == 0 {
		e.once.Do(e.eof)
	}
	return n, err
}
