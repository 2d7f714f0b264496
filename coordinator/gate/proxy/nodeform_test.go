package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
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
