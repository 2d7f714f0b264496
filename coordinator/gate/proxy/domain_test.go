package proxy_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
)

const regionLabel = "topology.kubernetes.io/region"

// TestViewDomains runs two views of one platform whose domains are disjoint
// regions, with and without the node cache: every read and write path that the
// platform view covers, now across domains.
func TestViewDomains(t *testing.T) {
	needEnv(t)
	for _, cached := range []bool{true, false} {
		name := "cached"
		if !cached {
			name = "uncached"
		}
		t.Run(name, func(t *testing.T) { testViewDomains(t, cached) })
	}
}

func testViewDomains(t *testing.T, cached bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	group := "dom"
	if !cached {
		group = "domu"
	}
	n := func(s string) string { return group + "-" + s }
	region := func(r string) map[string]string { return map[string]string{regionLabel: r} }
	fixture(t, group,
		gatetest.NodeSpec{Name: n("eu-1"), Platform: group + "-aws", ProviderID: "aws:///eu-west-1a/i-1", Labels: region("eu-west-1")},
		gatetest.NodeSpec{Name: n("eu-2"), Platform: group + "-aws", ProviderID: "aws:///eu-west-1b/i-2", Labels: region("eu-west-1")},
		gatetest.NodeSpec{Name: n("us-1"), Platform: group + "-aws", ProviderID: "aws:///us-east-1a/i-3", Labels: region("us-east-1")},
		gatetest.NodeSpec{Name: n("us-del"), Platform: group + "-aws", ProviderID: "aws:///us-east-1a/i-4", Labels: region("us-east-1")},
		gatetest.NodeSpec{Name: n("noregion"), Platform: group + "-aws", ProviderID: "aws:///x/i-5"},
		gatetest.NodeSpec{Name: n("hc-eu"), Platform: group + "-hc", ProviderID: "hcloud://6", Labels: region("eu-west-1")},
	)
	start := func(domain string) (*gate, func() []string) {
		g := startGate(t, group+"-aws", func(c *proxy.Config) { c.DomainSelector = domain; c.DisableCache = !cached })
		cs := g.client(t)
		return g, func() []string {
			t.Helper()
			l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return nodeNames(l.Items)
		}
	}
	eu, euList := start(regionLabel + "=eu-west-1")
	us, usList := start(regionLabel + " in (us-east-1)")
	euCS, usCS := eu.client(t), us.client(t)

	t.Run("lists show each domain's nodes only", func(t *testing.T) {
		if got, want := euList(), []string{n("eu-1"), n("eu-2")}; !slices.Equal(got, want) {
			t.Errorf("eu view lists %v, want %v", got, want)
		}
		if got, want := usList(), []string{n("us-1"), n("us-del")}; !slices.Equal(got, want) {
			t.Errorf("us view lists %v, want %v", got, want)
		}
	})
	t.Run("a client selector cannot reach the other domain", func(t *testing.T) {
		for _, sel := range []string{regionLabel + "=us-east-1", regionLabel + " in (us-east-1,eu-west-1)", regionLabel + "!=eu-west-1", "!" + regionLabel} {
			l, err := euCS.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				t.Fatalf("%s: %v", sel, err)
			}
			for _, node := range l.Items {
				if node.Labels[regionLabel] != "eu-west-1" {
					t.Errorf("selector %q showed %s of region %q", sel, node.Name, node.Labels[regionLabel])
				}
			}
		}
	})

	taint := []byte(`{"spec":{"taints":[{"key":"node.cloudprovider.kubernetes.io/shutdown","effect":"NoSchedule"}]}}`)
	other := []struct {
		name string
		do   func() error
	}{
		{"get", func() error { _, err := euCS.CoreV1().Nodes().Get(ctx, n("us-1"), metav1.GetOptions{}); return err }},
		{"get rv=0", func() error {
			_, err := euCS.CoreV1().Nodes().Get(ctx, n("us-1"), metav1.GetOptions{ResourceVersion: "0"})
			return err
		}},
		{"get a node without the domain label", func() error {
			_, err := euCS.CoreV1().Nodes().Get(ctx, n("noregion"), metav1.GetOptions{})
			return err
		}},
		{"get another platform's node of the same region", func() error {
			_, err := euCS.CoreV1().Nodes().Get(ctx, n("hc-eu"), metav1.GetOptions{})
			return err
		}},
		{"patch", func() error {
			_, err := euCS.CoreV1().Nodes().Patch(ctx, n("us-1"), types.StrategicMergePatchType, taint, metav1.PatchOptions{})
			return err
		}},
		{"patch status", func() error {
			_, err := euCS.CoreV1().Nodes().Patch(ctx, n("us-1"), types.MergePatchType, []byte(`{"status":{"phase":"x"}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{"delete", func() error { return euCS.CoreV1().Nodes().Delete(ctx, n("us-1"), metav1.DeleteOptions{}) }},
		{"delete a node without the domain label", func() error {
			return euCS.CoreV1().Nodes().Delete(ctx, n("noregion"), metav1.DeleteOptions{})
		}},
	}
	for _, tc := range other {
		t.Run("the other domain's node: "+tc.name, func(t *testing.T) {
			if err := tc.do(); !apierrors.IsNotFound(err) {
				t.Fatalf("want NotFound, got %v", err)
			}
		})
	}
	for _, name := range []string{n("us-1"), n("noregion")} {
		node, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil || slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "node.cloudprovider.kubernetes.io/shutdown" }) {
			t.Fatalf("%s after the other domain's requests: %v, taints %v", name, err, node.Spec.Taints)
		}
	}
	t.Run("own domain: patch and delete", func(t *testing.T) {
		if _, err := usCS.CoreV1().Nodes().Patch(ctx, n("us-1"), types.StrategicMergePatchType, taint, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := usCS.CoreV1().Nodes().Delete(ctx, n("us-del"), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Client.CoreV1().Nodes().Get(ctx, n("us-del"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("own node still there: %v", err)
		}
	})

	t.Run("a node relabelled into another domain leaves the view at once", func(t *testing.T) {
		w, err := euCS.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
			SendInitialEvents:    ptr.To(true),
			ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
			AllowWatchBookmarks:  true,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		var initial []string
		for ev := range w.ResultChan() {
			node := ev.Object.(*corev1.Node)
			if ev.Type == watch.Bookmark {
				if node.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
					break
				}
				continue
			}
			initial = append(initial, node.Name)
		}
		slices.Sort(initial)
		if want := []string{n("eu-1"), n("eu-2")}; !slices.Equal(initial, want) {
			t.Fatalf("initial events %v, want %v", initial, want)
		}
		if _, err := env.Client.CoreV1().Nodes().Patch(ctx, n("eu-2"), types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"`+regionLabel+`":"us-east-1"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		for ev := range w.ResultChan() {
			node := ev.Object.(*corev1.Node)
			if ev.Type == watch.Bookmark {
				continue
			}
			if ev.Type != watch.Deleted || node.Name != n("eu-2") {
				t.Fatalf("event %s %s, want DELETED %s", ev.Type, node.Name, n("eu-2"))
			}
			break
		}
		// the old owner may no longer read, change or delete it; the new one may
		for _, do := range []func() error{
			func() error { _, err := euCS.CoreV1().Nodes().Get(ctx, n("eu-2"), metav1.GetOptions{}); return err },
			func() error { return euCS.CoreV1().Nodes().Delete(ctx, n("eu-2"), metav1.DeleteOptions{}) },
		} {
			if err := do(); !apierrors.IsNotFound(err) {
				t.Fatalf("old owner after the relabel: want NotFound, got %v", err)
			}
		}
		if _, err := usCS.CoreV1().Nodes().Get(ctx, n("eu-2"), metav1.GetOptions{}); err != nil {
			t.Fatalf("new owner: %v", err)
		}
	})
	t.Run("legacy watch path", func(t *testing.T) {
		l, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "gatetest=" + group})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.Client.CoreV1().Nodes().Patch(ctx, n("us-1"), types.MergePatchType, []byte(`{"metadata":{"annotations":{"step":"1"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if events := legacyWatch(t, ctx, eu.url+"/api/v1/watch/nodes?timeoutSeconds=1&resourceVersion="+l.ResourceVersion); len(events) != 0 {
			t.Fatalf("eu view saw %v", events)
		}
		events := legacyWatch(t, ctx, us.url+"/api/v1/watch/nodes?timeoutSeconds=1&resourceVersion="+l.ResourceVersion)
		if !slices.Equal(events, []string{"MODIFIED " + n("us-1")}) {
			t.Fatalf("us view saw %v, want [MODIFIED %s]", events, n("us-1"))
		}
	})
}

// TestViewDomainSelectorRefused: a domain selector can only narrow the view,
// with requirements the fence can enforce too.
func TestViewDomainSelectorRefused(t *testing.T) {
	for _, sel := range []string{
		regionLabel + "!=eu-west-1",
		regionLabel + " notin (eu-west-1)",
		regionLabel,
		"!" + regionLabel,
		"x>1",
		"node.cloudprovider.kubernetes.io/platform=other",
		"region in (a",
	} {
		_, err := proxy.New(proxy.Config{Upstream: &rest.Config{Host: "https://127.0.0.1:1"}, Platform: "aws", DomainSelector: sel})
		if err == nil || !strings.Contains(err.Error(), "domain selector") {
			t.Errorf("domain selector %q: got %v, want an error naming the domain selector", sel, err)
		}
	}
	if _, err := proxy.New(proxy.Config{Upstream: &rest.Config{Host: "https://127.0.0.1:1"}, Platform: "aws", DomainSelector: regionLabel + " in (a,b),x.io/y=z"}); err != nil {
		t.Errorf("a valid domain selector: %v", err)
	}
}

// TestViewCacheBehind: a node cache that has not yet heard that a node left
// the view (here: it holds the node as it was, in the eu domain) must not let
// a client read the node as it now is. A client that saw the node leave on
// its own watch can GET it at once (TestViewDomains does, and met this under
// load); the answer is checked (JSON and protobuf), or held between reads of
// the node (other forms), and HEAD is checked with a read of the node. (The
// CCM's RBAC has no nodes/status get.)
func TestViewCacheBehind(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const group = "behind"
	platform := group + "-aws"
	n := func(s string) string { return group + "-" + s }
	fixture(t, group,
		gatetest.NodeSpec{Name: n("eu"), Platform: platform, ProviderID: "aws:///eu-west-1a/i-1", Labels: map[string]string{regionLabel: "eu-west-1"}},
		gatetest.NodeSpec{Name: n("left"), Platform: platform, ProviderID: "aws:///us-east-1a/i-2", Labels: map[string]string{regionLabel: "us-east-1"}},
	)
	g := startGate(t, platform, func(c *proxy.Config) { c.DomainSelector = regionLabel + "=eu-west-1" })
	if err := proxy.SetCachedNode(g.proxy, n("left"), map[string]string{platformLabel: platform, regionLabel: "eu-west-1"}); err != nil {
		t.Fatal(err)
	}
	pbCfg := g.config()
	pbCfg.ContentType = "application/vnd.kubernetes.protobuf"
	pbCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	clients := map[string]kubernetes.Interface{"json": g.client(t), "protobuf": kubernetes.NewForConfigOrDie(pbCfg)}
	for enc, cs := range clients {
		t.Run(enc, func(t *testing.T) {
			if _, err := cs.CoreV1().Nodes().Get(ctx, n("left"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("GET of the node that left: want NotFound, got %v", err)
			}
			node, err := cs.CoreV1().Nodes().Get(ctx, n("eu"), metav1.GetOptions{})
			if err != nil || node.Name != n("eu") || node.Labels[regionLabel] != "eu-west-1" || node.Spec.ProviderID != "aws:///eu-west-1a/i-1" {
				t.Fatalf("GET of a node in the view: %v, %+v", err, node)
			}
		})
	}
	// Reads whose answer the gate does not decode are held between reads.
	for _, accept := range []string{
		"application/json;as=Table;v=v1;g=meta.k8s.io",
		"application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
		"application/yaml",
	} {
		rc := clients["json"].CoreV1().RESTClient()
		res := rc.Get().Resource("nodes").Name(n("left")).SetHeader("Accept", accept).Do(ctx)
		var code int
		res.StatusCode(&code)
		if code != http.StatusNotFound {
			raw, _ := res.Raw()
			t.Errorf("GET with Accept %s of the node that left: %d %s, want 404", accept, code, raw)
		}
		res = rc.Get().Resource("nodes").Name(n("eu")).SetHeader("Accept", accept).Do(ctx)
		res.StatusCode(&code)
		if raw, _ := res.Raw(); code != http.StatusOK || !strings.Contains(string(raw), n("eu")) {
			t.Errorf("GET with Accept %s of a node in the view: %d %s", accept, code, raw)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, g.url+"/api/v1/nodes/"+n("left"), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("HEAD of the node that left: %s, want 404", resp.Status)
	}
}
