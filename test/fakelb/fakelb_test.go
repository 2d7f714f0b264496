package fakelb_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/fakelb"
)

func TestAPI(t *testing.T) {
	c := fakelb.New()
	srv := httptest.NewServer(c)
	defer srv.Close()
	do := func(method, path, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := do(http.MethodGet, "/loadbalancers/aws/shop/web", ""); got != http.StatusNotFound {
		t.Fatalf("GET of nothing: %d", got)
	}
	if got := do(http.MethodPut, "/loadbalancers/aws/shop/web", `{"nodes":["b","a"],"ports":[80]}`); got != http.StatusOK {
		t.Fatalf("PUT: %d", got)
	}
	if got := do(http.MethodPut, "/loadbalancers/hcloud/shop/web", `{"nodes":["h"]}`); got != http.StatusOK {
		t.Fatalf("PUT: %d", got)
	}
	if got := do(http.MethodPut, "/loadbalancers/aws/shop/web", `{"nodes":["c","a"],"ports":[80]}`); got != http.StatusOK {
		t.Fatalf("second PUT: %d", got)
	}
	lb, ok := c.Get("aws", "shop/web")
	if !ok || !slices.Equal(lb.Nodes, []string{"a", "c"}) || lb.IP != "203.0.113.1" || lb.Updates != 1 {
		t.Fatalf("aws load balancer %+v", lb)
	}
	if h, _ := c.Get("hcloud", "shop/web"); h.IP != "203.0.113.2" {
		t.Fatalf("hcloud load balancer %+v: each gets its own address", h)
	}
	for _, bad := range []string{"/loadbalancers/aws/shop", "/loadbalancers/aws//web", "/other/aws/shop/web"} {
		if got := do(http.MethodPut, bad, `{}`); got != http.StatusNotFound {
			t.Errorf("PUT %s: %d, want 404", bad, got)
		}
	}
	if got := do(http.MethodPut, "/loadbalancers/aws/shop/x", `{`); got != http.StatusBadRequest {
		t.Errorf("broken body: %d", got)
	}
	if got := do(http.MethodDelete, "/loadbalancers/aws/shop/web", ""); got != http.StatusNoContent {
		t.Fatalf("DELETE: %d", got)
	}
	if got := do(http.MethodDelete, "/loadbalancers/aws/shop/web", ""); got != http.StatusNoContent {
		t.Fatalf("second DELETE: %d", got)
	}
	if _, ok := c.Get("aws", "shop/web"); ok || !slices.Equal(c.Deleted(), []string{"aws/shop/web"}) {
		t.Fatalf("after DELETE: %v, deleted %v", c.LoadBalancers(), c.Deleted())
	}
}
