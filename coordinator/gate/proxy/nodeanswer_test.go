package proxy_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
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
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const group = "alike"
	platform := group + "-aws"
	n := func(s string) string { return group + "-" + s }
	fixture(t, group,
		gatetest.NodeSpec{Name: n("eu"), Platform: platform, ProviderID: "aws:///eu-west-1a/i-1", Labels: map[string]string{regionLabel: "eu-west-1"}},
		gatetest.NodeSpec{Name: n("left"), Platform: platform, ProviderID: "aws:///us-east-1a/i-2", Labels: map[string]string{regionLabel: "us-east-1"}},
		gatetest.NodeSpec{Name: n("us"), Platform: platform, ProviderID: "aws:///us-east-1a/i-3", Labels: map[string]string{regionLabel: "us-east-1"}},
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
