package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const platformLabel = names.PlatformLabel

// fixture creates nodes labelled gatetest=<group> and removes them at the end.
func fixture(t *testing.T, group string, specs ...gatetest.NodeSpec) {
	t.Helper()
	ctx := context.Background()
	for i := range specs {
		if specs[i].Labels == nil {
			specs[i].Labels = map[string]string{}
		}
		specs[i].Labels["gatetest"] = group
	}
	if err := gatetest.CreateNodes(ctx, env.Client, specs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := gatetest.DeleteNodes(context.Background(), env.Client, "gatetest="+group); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

func nodeNames(nodes []corev1.Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Name
	}
	slices.Sort(out)
	return out
}

func TestViewList(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	fixture(t, "list",
		gatetest.NodeSpec{Name: "list-hc-1", Platform: "list-hc", ProviderID: "hcloud://1", Ready: true, Labels: map[string]string{"zone": "a"}},
		gatetest.NodeSpec{Name: "list-hc-2", Platform: "list-hc", ProviderID: "hcloud://2", Labels: map[string]string{"zone": "b"}},
		gatetest.NodeSpec{Name: "list-aws-1", Platform: "list-aws", ProviderID: "aws:///a/i-1", Labels: map[string]string{"zone": "a"}},
		gatetest.NodeSpec{Name: "list-uninit", Labels: map[string]string{"zone": "a"}},
	)
	g := startGate(t, "list-hc", nil)
	cs := g.client(t)

	tests := []struct {
		name string
		// label and field are the client's selectors.
		label, field string
		// want are the node names the client gets.
		want []string
	}{
		{name: "no selector shows the platform's nodes", want: []string{"list-hc-1", "list-hc-2"}},
		{name: "client selector is combined", label: "zone=a", want: []string{"list-hc-1"}},
		{name: "asking for another platform gets nothing", label: platformLabel + "=list-aws"},
		{name: "set selector is narrowed", label: platformLabel + " in (list-aws,list-hc)", want: []string{"list-hc-1", "list-hc-2"}},
		{name: "negation gets nothing", label: platformLabel + "!=list-hc"},
		{name: "unlabelled nodes stay invisible", label: "!" + platformLabel},
		{name: "field selector on a foreign node", field: "metadata.name=list-aws-1"},
		{name: "field selector on an own node", field: "metadata.name=list-hc-2", want: []string{"list-hc-2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: tc.label, FieldSelector: tc.field})
			if err != nil {
				t.Fatal(err)
			}
			if got := nodeNames(l.Items); !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}

	t.Run("pages", func(t *testing.T) {
		var got []string
		opts := metav1.ListOptions{Limit: 1}
		for {
			l, err := cs.CoreV1().Nodes().List(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, nodeNames(l.Items)...)
			if l.Continue == "" {
				break
			}
			opts.Continue = l.Continue
		}
		if !slices.Equal(got, []string{"list-hc-1", "list-hc-2"}) {
			t.Fatalf("paged list %v", got)
		}
	})
	t.Run("resourceVersion=0 list from the watch cache", func(t *testing.T) {
		l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			t.Fatal(err)
		}
		if got := nodeNames(l.Items); !slices.Equal(got, []string{"list-hc-1", "list-hc-2"}) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("unparsable selector is refused", func(t *testing.T) {
		_, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "zone in (a"})
		if !apierrors.IsBadRequest(err) {
			t.Fatalf("want BadRequest, got %v", err)
		}
	})
	t.Run("repeated labelSelector is refused", func(t *testing.T) {
		code, _ := rawGet(t, g.url+"/api/v1/nodes?labelSelector=zone%3Da&labelSelector=zone%3Db")
		if code != http.StatusBadRequest {
			t.Fatalf("status %d, want 400", code)
		}
	})
}

func TestViewSingleNode(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	fixture(t, "one",
		gatetest.NodeSpec{Name: "one-hc-1", Platform: "one-hc", ProviderID: "hcloud://1"},
		gatetest.NodeSpec{Name: "one-hc-del", Platform: "one-hc", ProviderID: "hcloud://2"},
		gatetest.NodeSpec{Name: "one-hc-del-pb", Platform: "one-hc", ProviderID: "hcloud://3"},
		gatetest.NodeSpec{Name: "one-aws-1", Platform: "one-aws", ProviderID: "aws:///a/i-1"},
		gatetest.NodeSpec{Name: "one-uninit"},
	)
	g := startGate(t, "one-hc", nil)
	cs := g.client(t)
	admin := env.Client
	taint := []byte(`{"spec":{"taints":[{"key":"node.cloudprovider.kubernetes.io/shutdown","effect":"NoSchedule"}]}}`)

	hidden := []struct {
		name string
		// do is a request for a node outside the view; it must answer NotFound.
		do func() error
	}{
		{name: "get foreign", do: func() error { _, err := cs.CoreV1().Nodes().Get(ctx, "one-aws-1", metav1.GetOptions{}); return err }},
		{name: "get foreign rv=0", do: func() error {
			_, err := cs.CoreV1().Nodes().Get(ctx, "one-aws-1", metav1.GetOptions{ResourceVersion: "0"})
			return err
		}},
		{name: "get uninitialized", do: func() error { _, err := cs.CoreV1().Nodes().Get(ctx, "one-uninit", metav1.GetOptions{}); return err }},
		{name: "get missing", do: func() error { _, err := cs.CoreV1().Nodes().Get(ctx, "one-missing", metav1.GetOptions{}); return err }},
		{name: "get foreign status", do: func() error {
			return cs.CoreV1().RESTClient().Get().Resource("nodes").Name("one-aws-1").SubResource("status").Do(ctx).Error()
		}},
		{name: "proxy to foreign node", do: func() error {
			return cs.CoreV1().RESTClient().Get().Resource("nodes").Name("one-aws-1").SubResource("proxy", "metrics").Do(ctx).Error()
		}},
		{name: "strategic-merge patch foreign", do: func() error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, "one-aws-1", types.StrategicMergePatchType, taint, metav1.PatchOptions{})
			return err
		}},
		{name: "patch foreign status", do: func() error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, "one-aws-1", types.MergePatchType, []byte(`{"status":{"phase":"x"}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		{name: "put foreign", do: func() error {
			n, err := admin.CoreV1().Nodes().Get(ctx, "one-aws-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Annotations = map[string]string{"x": "y"}
			_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		}},
		{name: "claim uninitialized node by label", do: func() error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, "one-uninit", types.MergePatchType, []byte(`{"metadata":{"labels":{"`+platformLabel+`":"one-hc"}}}`), metav1.PatchOptions{})
			return err
		}},
		{name: "server-side apply creating a node", do: func() error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, "one-new", types.ApplyPatchType, []byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"one-new"}}`), metav1.PatchOptions{FieldManager: "x"})
			return err
		}},
		{name: "delete foreign", do: func() error { return cs.CoreV1().Nodes().Delete(ctx, "one-aws-1", metav1.DeleteOptions{}) }},
		{name: "delete uninitialized", do: func() error { return cs.CoreV1().Nodes().Delete(ctx, "one-uninit", metav1.DeleteOptions{}) }},
	}
	for _, tc := range hidden {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); !apierrors.IsNotFound(err) {
				t.Fatalf("want NotFound, got %v", err)
			}
		})
	}
	for _, n := range []string{"one-aws-1", "one-uninit"} {
		node, err := admin.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("foreign node %s: %v", n, err)
		}
		shutdown := slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "node.cloudprovider.kubernetes.io/shutdown" })
		if shutdown || node.Labels[platformLabel] == "one-hc" || node.Annotations["x"] != "" {
			t.Fatalf("foreign node %s was changed: %v %+v", n, node.Labels, node.Spec.Taints)
		}
	}
	if _, err := admin.CoreV1().Nodes().Get(ctx, "one-new", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("server-side apply created a node through the gate: %v", err)
	}

	t.Run("get own", func(t *testing.T) {
		for _, rv := range []string{"", "0"} {
			n, err := cs.CoreV1().Nodes().Get(ctx, "one-hc-1", metav1.GetOptions{ResourceVersion: rv})
			if err != nil || n.Name != "one-hc-1" {
				t.Fatalf("rv=%q: %v", rv, err)
			}
		}
		// The CCM may patch nodes/status but not get it: the API server answers.
		err := cs.CoreV1().RESTClient().Get().Resource("nodes").Name("one-hc-1").SubResource("status").Do(ctx).Error()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "nodes/status") {
			t.Fatalf("status: want the API server's RBAC answer, got %v", err)
		}
		if _, err := cs.CoreV1().Nodes().Patch(ctx, "one-hc-1", types.StrategicMergePatchType, []byte(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Probe"}]}}`), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("patch own status: %v", err)
		}
	})
	t.Run("proxy to own node reaches the API server", func(t *testing.T) {
		// The CCM has no nodes/proxy permission: the API server, not the gate, says no.
		err := cs.CoreV1().RESTClient().Get().Resource("nodes").Name("one-hc-1").SubResource("proxy", "metrics").Do(ctx).Error()
		if !apierrors.IsForbidden(err) {
			t.Fatalf("want the API server's Forbidden, got %v", err)
		}
	})
	t.Run("strategic-merge patch own (shutdown taint)", func(t *testing.T) {
		if _, err := cs.CoreV1().Nodes().Patch(ctx, "one-hc-1", types.StrategicMergePatchType, taint, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		n, _ := admin.CoreV1().Nodes().Get(ctx, "one-hc-1", metav1.GetOptions{})
		if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "node.cloudprovider.kubernetes.io/shutdown" {
			t.Fatalf("taints %+v", n.Spec.Taints)
		}
	})
	t.Run("delete own without preconditions", func(t *testing.T) {
		if err := cs.CoreV1().Nodes().Delete(ctx, "one-hc-del", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Nodes().Get(ctx, "one-hc-del", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("node still there: %v", err)
		}
	})
	t.Run("delete own with a protobuf client", func(t *testing.T) {
		cfg := g.config()
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		pb := kubernetes.NewForConfigOrDie(cfg)
		if err := pb.CoreV1().Nodes().Delete(ctx, "one-hc-del-pb", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Nodes().Get(ctx, "one-hc-del-pb", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("node still there: %v", err)
		}
	})

	refused := []struct {
		name string
		do   func() error
		// check classifies the error.
		check func(error) bool
	}{
		{name: "deletecollection", do: func() error {
			return cs.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		}, check: apierrors.IsForbidden},
		{name: "create", do: func() error {
			_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "one-created", Labels: map[string]string{platformLabel: "one-hc"}}}, metav1.CreateOptions{})
			return err
		}, check: apierrors.IsForbidden},
		{name: "legacy proxy path", do: func() error {
			return cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/proxy/nodes/one-aws-1/pods").Do(ctx).Error()
		}, check: apierrors.IsForbidden},
	}
	for _, tc := range refused {
		t.Run(tc.name+" is refused", func(t *testing.T) {
			if err := tc.do(); !tc.check(err) {
				t.Fatalf("got %v", err)
			}
		})
	}
	if l, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "gatetest=one"}); err != nil || len(l.Items) != 3 {
		t.Fatalf("after refused requests: %d nodes (%v), want 3", len(l.Items), err)
	}
	t.Run("escaped slash is refused", func(t *testing.T) {
		if code, _ := rawGet(t, g.url+"/api/v1/nodes/one-aws-1%2Fstatus"); code != http.StatusBadRequest {
			t.Fatalf("status %d, want 400", code)
		}
	})
}

// TestViewDeleteRelabelRace relabels the node between the gate's check and
// the forwarded DELETE: the preconditions make the API server refuse it.
func TestViewDeleteRelabelRace(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	fixture(t, "race", gatetest.NodeSpec{Name: "race-1", Platform: "race-hc", ProviderID: "hcloud://1"})
	upstream := rest.CopyConfig(ccmConfig)
	upstream.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodDelete && strings.HasSuffix(r.URL.Path, "/nodes/race-1") {
				_, err := env.Client.CoreV1().Nodes().Patch(ctx, "race-1", types.MergePatchType,
					[]byte(`{"metadata":{"labels":{"`+platformLabel+`":"race-aws"}}}`), metav1.PatchOptions{})
				if err != nil {
					return nil, err
				}
			}
			return rt.RoundTrip(r)
		})
	}
	g := startGate(t, "race-hc", func(c *proxy.Config) { c.Upstream = upstream })
	err := g.client(t).CoreV1().Nodes().Delete(ctx, "race-1", metav1.DeleteOptions{})
	if !apierrors.IsConflict(err) {
		t.Fatalf("want Conflict from the preconditions, got %v", err)
	}
	n, err := env.Client.CoreV1().Nodes().Get(ctx, "race-1", metav1.GetOptions{})
	if err != nil || n.Labels[platformLabel] != "race-aws" {
		t.Fatalf("relabelled node: %v %v", n.Labels, err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestViewWatchBookmarksAndResume(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fixture(t, "bm",
		gatetest.NodeSpec{Name: "bm-hc-1", Platform: "bm-hc", ProviderID: "hcloud://1"},
		gatetest.NodeSpec{Name: "bm-hc-2", Platform: "bm-hc", ProviderID: "hcloud://2"},
		gatetest.NodeSpec{Name: "bm-aws-1", Platform: "bm-aws", ProviderID: "aws:///a/i-1"},
		gatetest.NodeSpec{Name: "bm-uninit"},
	)
	g := startGate(t, "bm-hc", nil)
	cs := g.client(t)

	// WatchList: initial events, then the initial-events-end bookmark.
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
	})
	if err != nil {
		t.Fatal(err)
	}
	var initial []string
	var bookmarkRV string
	for ev := range w.ResultChan() {
		n, ok := ev.Object.(*corev1.Node)
		if !ok {
			t.Fatalf("event %s with %T", ev.Type, ev.Object)
		}
		if ev.Type == "BOOKMARK" {
			if n.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
				bookmarkRV = n.ResourceVersion
				break
			}
			continue
		}
		if ev.Type != "ADDED" {
			t.Fatalf("initial event %s %s", ev.Type, n.Name)
		}
		initial = append(initial, n.Name)
	}
	w.Stop()
	slices.Sort(initial)
	if !slices.Equal(initial, []string{"bm-hc-1", "bm-hc-2"}) || bookmarkRV == "" {
		t.Fatalf("initial events %v, bookmark rv %q", initial, bookmarkRV)
	}

	// Changes while nobody watches: a foreign node first, then an own one.
	annotate := func(name, v string) {
		t.Helper()
		if _, err := env.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"annotations":{"step":"`+v+`"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate("bm-aws-1", "1")
	annotate("bm-uninit", "1")
	annotate("bm-hc-2", "1")

	t.Run("resume from the bookmark", func(t *testing.T) {
		w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: bookmarkRV})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		ev := <-w.ResultChan()
		n, _ := ev.Object.(*corev1.Node)
		if ev.Type != "MODIFIED" || n == nil || n.Name != "bm-hc-2" {
			t.Fatalf("first event after resume: %s %v, want MODIFIED bm-hc-2", ev.Type, n)
		}
	})
	t.Run("legacy watch path", func(t *testing.T) {
		events := legacyWatch(t, ctx, g.url+"/api/v1/watch/nodes?timeoutSeconds=2&resourceVersion="+bookmarkRV)
		if len(events) != 1 || events[0] != "MODIFIED bm-hc-2" {
			t.Fatalf("events %v, want [MODIFIED bm-hc-2]", events)
		}
	})
	t.Run("legacy watch of a foreign node", func(t *testing.T) {
		if events := legacyWatch(t, ctx, g.url+"/api/v1/watch/nodes/bm-aws-1?timeoutSeconds=1&resourceVersion="+bookmarkRV); len(events) != 0 {
			t.Fatalf("events %v for a foreign node", events)
		}
	})
}

// legacyWatch reads a watch stream until the server ends it and returns
// "TYPE name" per event.
func legacyWatch(t *testing.T, ctx context.Context, url string) []string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	dec := json.NewDecoder(resp.Body)
	var out []string
	for {
		var ev struct {
			Type   string      `json:"type"`
			Object corev1.Node `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if err == io.EOF {
				return out
			}
			t.Fatal(err)
		}
		out = append(out, ev.Type+" "+ev.Object.Name)
	}
}

func TestViewPassthrough(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	g := startGate(t, "pass-hc", nil)
	cs := g.client(t)

	t.Run("healthz is the API server's", func(t *testing.T) {
		code, body := rawGet(t, g.url+"/healthz")
		if code != http.StatusOK || body != "ok" {
			t.Fatalf("%d %q", code, body)
		}
	})
	t.Run("discovery", func(t *testing.T) {
		v, err := cs.Discovery().ServerVersion()
		if err != nil || v.GitVersion == "" {
			t.Fatalf("version %v: %v", v, err)
		}
		if _, err := cs.Discovery().ServerGroups(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("leader election lease", func(t *testing.T) {
		now := metav1.NewMicroTime(time.Now())
		l, err := cs.CoordinationV1().Leases(ccmNamespace).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "pass-hc-lease"},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("ccm-0"), AcquireTime: &now, RenewTime: &now, LeaseDurationSeconds: ptr.To[int32](15)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		if _, err := cs.CoordinationV1().Leases(ccmNamespace).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		_ = env.Client.CoordinationV1().Leases(ccmNamespace).Delete(ctx, "pass-hc-lease", metav1.DeleteOptions{})
	})
	t.Run("events", func(t *testing.T) {
		_, err := cs.CoreV1().Events("default").Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "pass-hc-"},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "pass-hc-1"},
			Reason:         "Test", Message: "through the gate", Type: corev1.EventTypeNormal,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("the gate adds no privilege", func(t *testing.T) {
		_, err := cs.CoreV1().Secrets(ccmNamespace).List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("want the API server's Forbidden, got %v", err)
		}
	})
}

func TestViewForwardCredentials(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	token, err := gatetest.ServiceAccountToken(ctx, env.Client, ccmNamespace, ccmName)
	if err != nil {
		t.Fatal(err)
	}
	fixture(t, "fwd",
		gatetest.NodeSpec{Name: "fwd-hc-1", Platform: "fwd-hc", ProviderID: "hcloud://1"},
		gatetest.NodeSpec{Name: "fwd-aws-1", Platform: "fwd-aws", ProviderID: "aws:///a/i-1"},
	)
	// The gate's own credentials (the same ServiceAccount) serve only its cache.
	own := &rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerToken: token}
	g := startGate(t, "fwd-hc", func(c *proxy.Config) {
		c.Upstream = own
		c.Credentials = proxy.ForwardCredentials
	})
	withToken := g.config()
	withToken.BearerToken = token
	cs := kubernetes.NewForConfigOrDie(withToken)

	l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || !slices.Equal(nodeNames(l.Items), []string{"fwd-hc-1"}) {
		t.Fatalf("list with the CCM's token: %v %v", nodeNames(l.Items), err)
	}
	if _, err := cs.CoreV1().Nodes().Get(ctx, "fwd-aws-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("foreign get: %v", err)
	}
	if _, err := cs.CoreV1().Nodes().Patch(ctx, "fwd-hc-1", types.MergePatchType, []byte(`{"metadata":{"annotations":{"a":"b"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("own patch with the CCM's token: %v", err)
	}

	t.Run("without credentials the API server sees nobody", func(t *testing.T) {
		_, err := g.client(t).CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) {
			t.Fatalf("anonymous list through the gate: %v", err)
		}
		_, err = g.client(t).CoreV1().Nodes().Get(ctx, "fwd-hc-1", metav1.GetOptions{})
		if !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) {
			t.Fatalf("anonymous get through the gate: %v", err)
		}
	})
	t.Run("impersonation is the API server's decision", func(t *testing.T) {
		imp := rest.CopyConfig(withToken)
		imp.Impersonate = rest.ImpersonationConfig{UserName: "system:admin", Groups: []string{"system:masters"}}
		_, err := kubernetes.NewForConfigOrDie(imp).CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("impersonating through the gate: %v", err)
		}
	})
}

func TestViewLargeList(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const total = 5000
	specs := make([]gatetest.NodeSpec, total)
	for i := range specs {
		p, id := "bulk-hc", fmt.Sprintf("hcloud://%d", i)
		if i%2 == 1 {
			p, id = "bulk-aws", fmt.Sprintf("aws:///a/i-%d", i)
		}
		specs[i] = gatetest.NodeSpec{Name: fmt.Sprintf("bulk-%04d", i), Platform: p, ProviderID: id, Ready: true}
	}
	fixture(t, "bulk", specs...)
	g := startGate(t, "bulk-hc", nil)
	cs := g.client(t)

	l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(l.Items) != total/2 {
		t.Fatalf("list: %d nodes (%v), want %d", len(l.Items), err, total/2)
	}
	for _, n := range l.Items {
		if n.Labels[platformLabel] != "bulk-hc" {
			t.Fatalf("foreign node %s in the list", n.Name)
		}
	}
	count := 0
	opts := metav1.ListOptions{Limit: 500}
	for {
		l, err := cs.CoreV1().Nodes().List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		count += len(l.Items)
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	if count != total/2 {
		t.Fatalf("paged list: %d, want %d", count, total/2)
	}
	// Every single-node check of the platform's nodes comes from the cache.
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Nodes().Get(ctx, "bulk-4998", metav1.GetOptions{ResourceVersion: "0"})
		return err == nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func rawGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
