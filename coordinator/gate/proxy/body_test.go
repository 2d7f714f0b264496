package proxy_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
)

// h2Gate serves a gate over TLS with HTTP/2 (as ccm-gate serves) in front of
// upstream, itself an HTTP/2 server; it returns a client of the gate.
func h2Gate(t *testing.T, upstream http.Handler) (string, *http.Client) {
	t.Helper()
	return tlsGate(t, upstream, true)
}

// tlsGate is h2Gate with the client speaking HTTP/2 or, without h2,
// HTTP/1.1 to the gate.
func tlsGate(t *testing.T, upstream http.Handler, h2 bool) (string, *http.Client) {
	t.Helper()
	up := httptest.NewUnstartedServer(upstream)
	up.EnableHTTP2 = true
	up.StartTLS()
	t.Cleanup(up.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw})
	p, err := proxy.New(proxy.Config{
		Upstream:     &rest.Config{Host: up.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}},
		Platform:     "hcloud",
		DisableCache: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	g := httptest.NewUnstartedServer(p)
	g.EnableHTTP2 = h2
	g.StartTLS()
	t.Cleanup(g.Close)
	c := g.Client()
	c.Timeout = 20 * time.Second
	return g.URL, c
}

const leasePath = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/native-ccm"

// TestEarlyAnswerDoesNotHang: the API server refuses a write before it reads
// the body (authorization does), and client-go's HTTP/2 transport stops
// sending a body once it sees a 4xx. The gate must still end its answer: it
// takes the client's whole body before it forwards anything. (Streaming the
// body instead left the gate waiting for the rest of a body the client had
// stopped sending, and the client waiting for the end of the answer, until
// the client's deadline.)
func TestEarlyAnswerDoesNotHang(t *testing.T) {
	url, c := h2Gate(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPatch {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden) // the body is never read
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`)
			return
		}
		http.NotFound(w, r)
	}))
	for i := range 3 {
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write([]byte(`{"spec":{"holderIdentity":`))
			// The rest of the body comes after a pause: an answer relayed
			// before it ends reaches a client that is still sending.
			time.Sleep(300 * time.Millisecond)
			_, _ = pw.Write([]byte(`"x"}}`))
			_ = pw.Close()
		}()
		req, err := http.NewRequest(http.MethodPatch, url+leasePath, pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/merge-patch+json")
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d: the answer never ended (after %s): %v", i, time.Since(start).Round(time.Millisecond), err)
		}
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "Forbidden") {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
}

// TestRequestBodies: a forwarded body arrives whole with its length; one
// larger than the API server accepts is refused by the gate with 413.
func TestRequestBodies(t *testing.T) {
	got := make(chan []byte, 1)
	url, c := h2Gate(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.ContentLength != int64(len(b)) {
			http.Error(w, "length "+strconv.FormatInt(r.ContentLength, 10)+" of a body of "+strconv.Itoa(len(b)), http.StatusBadRequest)
			return
		}
		got <- b
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{}`)
	}))
	send := func(body io.Reader) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, url+leasePath, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp, string(b)
	}
	// Chunked (no length given): the gate gives it one.
	want := bytes.Repeat([]byte("a"), 100_000)
	if resp, b := send(io.MultiReader(bytes.NewReader(want))); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the API server got %d bytes, want %d", len(b), len(want))
	}
	for name, body := range map[string]io.Reader{
		"with its length": bytes.NewReader(make([]byte, 3<<20+1)),
		"chunked":         io.MultiReader(bytes.NewReader(make([]byte, 3<<20+1))),
	} {
		resp, b := send(body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(b, "request body too large") {
			t.Errorf("%s: %d %s", name, resp.StatusCode, b)
		}
	}
	select {
	case b := <-got:
		t.Fatalf("a body too large was forwarded (%d bytes)", len(b))
	default:
	}
}
