package proxy_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
)

// Canaries: strings that only Services outside the view carry (as an
// annotation value, in their names), and the states of Services in the view
// that the CCM may not see. None may appear in any byte the gate sends.
const (
	foreignCanary = "leak-canary"
	// leavingCanary is set by the change that takes own-leaving out of the
	// view: the CCM may see its deletion, not its new state.
	leavingCanary = "leaving-canary"
	// enteringCanary is what entering carries before it enters the view.
	enteringCanary = "entering-canary"
	// markerCanary marks the end of the changes the watches wait for.
	markerCanary = "marker-canary"
	matrixNS     = "svc-matrix"
)

// matrixRequest is one request of the parameter matrix.
type matrixRequest struct {
	path, accept string
	query        url.Values
	// upgrade names the protocol switch the request asks for (upgradeHeaders);
	// the gate must refuse it.
	upgrade string
}

func (r matrixRequest) String() string {
	if r.upgrade != "" {
		return fmt.Sprintf("%s?%s (%s, %s)", r.path, r.query.Encode(), r.accept, r.upgrade)
	}
	return fmt.Sprintf("%s?%s (%s)", r.path, r.query.Encode(), r.accept)
}

// upgradeHeaders are the headers of each protocol switch a client can ask
// for: a WebSocket watch (as kubectl and client-go's WebSocket clients send
// it, with the API server's base64 subprotocol), SPDY, an h2c upgrade, and a
// bare "Connection: upgrade".
var upgradeHeaders = map[string]http.Header{
	"websocket": {"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"},
		"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}, "Sec-Websocket-Protocol": {"base64.binary.k8s.io"}},
	"spdy":               {"Connection": {"Upgrade"}, "Upgrade": {"SPDY/3.1"}, "X-Stream-Protocol-Version": {"v4.channel.k8s.io"}},
	"h2c":                {"Connection": {"Upgrade, HTTP2-Settings"}, "Upgrade": {"h2c"}, "Http2-Settings": {"AAMAAABkAARAAAAAAAIAAAAA"}},
	"connection-upgrade": {"Connection": {"keep-alive, upgrade"}},
}

// upgradeMatrix is a list and a watch of every Service path, each with every
// protocol switch of upgradeHeaders (security round three, hole 3: the API
// server serves watches over WebSocket, and a 101 relayed raw would carry
// every Service).
func upgradeMatrix() []matrixRequest {
	var out []matrixRequest
	for _, path := range []string{"/api/v1/services", "/api/v1/namespaces/" + matrixNS + "/services", "/api/v1/watch/services",
		"/api/v1/namespaces/" + matrixNS + "/services/foreign-aws"} {
		for _, w := range []string{"", "true"} {
			for up := range upgradeHeaders {
				q := url.Values{}
				if w != "" && !strings.Contains(path, "/watch/") && !strings.HasSuffix(path, "foreign-aws") {
					q.Set("watch", w)
				}
				out = append(out, matrixRequest{path: path, accept: "application/json", query: q, upgrade: up})
			}
		}
	}
	return out
}

// watches reports whether the request is a watch (the API server's reading
// of the parameter).
func (r matrixRequest) watches() bool {
	if strings.HasPrefix(r.path, "/api/v1/watch/") {
		return true
	}
	v, ok := r.query["watch"]
	return ok && v[0] != "false" && v[0] != "0"
}

// serviceMatrix is every combination of the parameters that decide what a
// list or watch of Services returns.
func serviceMatrix(rvOld, rvCurrent string) []matrixRequest {
	var out []matrixRequest
	paths := []string{"/api/v1/services", "/api/v1/namespaces/" + matrixNS + "/services", "/api/v1/watch/services", "/api/v1/watch/namespaces/" + matrixNS + "/services"}
	opt := func(vs ...string) []string { return append([]string{""}, vs...) }
	for _, path := range paths {
		legacy := strings.HasPrefix(path, "/api/v1/watch/")
		watches := opt("true", "false")
		if legacy {
			watches = []string{""}
		}
		for _, w := range watches {
			for _, sie := range opt("true", "false") {
				for _, rv := range opt("0", rvOld, rvCurrent) {
					for _, rvm := range opt("NotOlderThan", "Exact") {
						for _, bm := range opt("true") {
							for _, limit := range opt("1") {
								for _, accept := range []string{"application/json", "application/vnd.kubernetes.protobuf"} {
									q := url.Values{}
									set := func(k, v string) {
										if v != "" {
											q.Set(k, v)
										}
									}
									set("watch", w)
									set("sendInitialEvents", sie)
									set("resourceVersion", rv)
									set("resourceVersionMatch", rvm)
									set("allowWatchBookmarks", bm)
									set("limit", limit)
									r := matrixRequest{path: path, accept: accept, query: q}
									if r.watches() {
										if limit != "" {
											continue // a watch has no pages
										}
										q.Set("timeoutSeconds", "60")
									}
									out = append(out, r)
								}
							}
						}
					}
				}
			}
		}
	}
	return out
}

// matrixAnswer is what the gate sent for one request.
type matrixAnswer struct {
	req  matrixRequest
	code int
	body []byte
	// events are a watch's, decoded as client-go does, up to the marker.
	events []watch.Event
	err    error
}

// TestServiceViewMatrix sends every combination of watch, sendInitialEvents,
// resourceVersion ("", 0, older than the gate, current),
// resourceVersionMatch, allowWatchBookmarks and limit, as JSON and protobuf,
// cluster-wide, for a namespace and on the legacy watch paths, with the
// client token and the load-balancer role, while Services outside the view
// change, one leaves the view and one enters it. No answer may carry any
// byte of a Service outside the view, of the state a Service left the view
// in, or of the state before one entered it; a DELETED is for a Service the
// CCM saw, and carries no more than that.
func TestServiceViewMatrix(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	canary := map[string]string{"canary": foreignCanary}
	serviceFixture(t, matrixNS,
		svcSpec{name: "own", class: ptr.To(ownClass)},
		svcSpec{name: "own-leaving", class: ptr.To(ownClass)},
		svcSpec{name: "entering", typ: corev1.ServiceTypeClusterIP, labels: map[string]string{"canary": enteringCanary}},
		svcSpec{name: "foreign-aws", class: ptr.To(awsClass), labels: canary},
		svcSpec{name: "foreign-classless", labels: canary},
		svcSpec{name: "foreign-clusterip", typ: corev1.ServiceTypeClusterIP, labels: canary},
		svcSpec{name: "foreign-nodeport", typ: corev1.ServiceTypeNodePort, labels: canary},
	)
	admin := env.Client.CoreV1()
	patch := func(ns, name, p string) {
		t.Helper()
		if _, err := admin.Services(ns).Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatalf("patch %s/%s: %v", ns, name, err)
		}
	}
	// default/kubernetes is outside every view too.
	patch("default", "kubernetes", `{"metadata":{"annotations":{"canary":"`+foreignCanary+`"}}}`)
	t.Cleanup(func() {
		_, _ = admin.Services("default").Patch(context.Background(), "kubernetes", types.MergePatchType, []byte(`{"metadata":{"annotations":{"canary":null}}}`), metav1.PatchOptions{})
	})
	l, err := admin.Services(matrixNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rvOld := l.ResourceVersion
	// A change after rvOld and before the gate starts: rvOld is older than
	// anything the gate has seen.
	patch(matrixNS, "foreign-aws", `{"metadata":{"annotations":{"step":"before-the-gate"}}}`)

	token := strings.Repeat("t", 43)
	g := startGate(t, "svc-hc", func(c *proxy.Config) {
		c.LoadBalancerClass = ownClass
		c.ClientToken = []byte(token)
	})
	l, err = admin.Services(matrixNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rvCurrent := l.ResourceVersion

	reqs := append(serviceMatrix(rvOld, rvCurrent), upgradeMatrix()...)
	answers := make([]*matrixAnswer, len(reqs))
	var opened, done sync.WaitGroup
	for i, r := range reqs {
		answers[i] = &matrixAnswer{req: r}
		opened.Add(1)
		done.Add(1)
		go func(a *matrixAnswer) {
			defer done.Done()
			a.fetch(ctx, g.url, token, &opened)
		}(answers[i])
	}
	opened.Wait()
	t.Logf("%d requests open", len(reqs))

	// The changes every watch sees (or would, without the view).
	patch(matrixNS, "foreign-aws", `{"metadata":{"annotations":{"step":"1"}}}`)
	patch(matrixNS, "foreign-classless", `{"metadata":{"annotations":{"step":"1"}}}`)
	patch(matrixNS, "foreign-clusterip", `{"metadata":{"annotations":{"step":"1"}}}`)
	patch(matrixNS, "foreign-nodeport", `{"metadata":{"annotations":{"step":"1"}}}`)
	patch("default", "kubernetes", `{"metadata":{"annotations":{"step":"1"}}}`)
	patch(matrixNS, "own", `{"metadata":{"annotations":{"step":"1"}}}`)
	patch(matrixNS, "own-leaving", `{"metadata":{"annotations":{"canary":"`+leavingCanary+`"}},"spec":{"type":"ClusterIP","loadBalancerClass":null}}`)
	patch(matrixNS, "entering", `{"metadata":{"labels":{"canary":null}},"spec":{"type":"LoadBalancer","loadBalancerClass":"`+ownClass+`"}}`)
	if err := admin.Services(matrixNS).Delete(ctx, "foreign-nodeport", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	marker := svcSpec{name: "marker", class: ptr.To(ownClass), labels: map[string]string{"canary": markerCanary}}
	if _, err := admin.Services(matrixNS).Create(ctx, marker.service(matrixNS), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done.Wait()

	seen := map[string]int{}
	for _, a := range answers {
		a.check(t, seen, rvOld)
	}
	t.Logf("answers by status: %v", seen)
	// The matrix must have exercised what it is for.
	if seen["watch 200"] == 0 || seen["list 200"] == 0 || seen["upgrade 403"] == 0 {
		t.Fatalf("no successful watches or lists: %v", seen)
	}
}

// fetch sends the request and reads the answer: a list to its end, a watch
// until the marker passes or it ends.
func (a *matrixAnswer) fetch(ctx context.Context, base, token string, opened *sync.WaitGroup) {
	once := sync.OnceFunc(opened.Done)
	defer once()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var resp *http.Response
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+a.req.path+"?"+a.req.query.Encode(), nil)
		if err != nil {
			a.err = err
			return
		}
		req.Header.Set("Accept", a.req.accept)
		req.Header.Set("Authorization", "Bearer "+token)
		for k, vs := range upgradeHeaders[a.req.upgrade] {
			req.Header[k] = vs
		}
		if resp, err = http.DefaultClient.Do(req); err != nil {
			a.err = err
			return
		}
		if resp.StatusCode != http.StatusTooManyRequests {
			break
		}
		// The API server's limit of requests in flight: all of them are
		// sent at once. Again, before the changes begin.
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
	}
	defer func() { _ = resp.Body.Close() }()
	a.code = resp.StatusCode
	once()
	var raw bytes.Buffer
	defer func() { a.body = raw.Bytes() }()
	body := io.TeeReader(resp.Body, &raw)
	if !a.req.watches() || a.code != http.StatusOK {
		if a.code == http.StatusSwitchingProtocols {
			// whatever comes through the switched connection, for a while
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			defer rcancel()
			go func() { <-rctx.Done(); _ = resp.Body.Close() }()
		}
		_, a.err = io.ReadAll(body)
		return
	}
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), a.req.accept)
	s := info.StreamSerializer
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(s.Framer.NewFrameReader(io.NopCloser(body)), s.Serializer),
		scheme.Codecs.DecoderToVersion(info.Serializer, corev1.SchemeGroupVersion))
	for {
		typ, obj, err := dec.Decode()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				a.err = err
			}
			return
		}
		a.events = append(a.events, watch.Event{Type: typ, Object: obj})
		if s, ok := obj.(*corev1.Service); ok && s.Name == "marker" {
			return
		}
	}
}

// check fails the test for anything in the answer the CCM may not see, and
// for a watch that does not bring its client to the view.
func (a *matrixAnswer) check(t *testing.T, seen map[string]int, rvOld string) {
	t.Helper()
	kind := "list"
	if a.req.watches() {
		kind = "watch"
	}
	seen[fmt.Sprintf("%s %d", kind, a.code)]++
	if a.err != nil {
		t.Errorf("%s: %v", a.req, a.err)
	}
	for _, c := range []string{foreignCanary, leavingCanary, enteringCanary, "foreign-"} {
		if bytes.Contains(a.body, []byte(c)) {
			t.Errorf("%s: answer %d carries %q: %s", a.req, a.code, c, printable(a.body))
		}
	}
	if a.req.upgrade != "" {
		seen[fmt.Sprintf("upgrade %d", a.code)]++
		if a.code != http.StatusForbidden || !bytes.Contains(a.body, []byte("not served")) {
			t.Errorf("%s: answer %d, want the gate's refusal (403): %s", a.req, a.code, printable(a.body))
		}
		return
	}
	if a.code != http.StatusOK {
		return
	}
	if !a.req.watches() {
		info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), a.req.accept)
		var list corev1.ServiceList
		if _, _, err := scheme.Codecs.DecoderToVersion(info.Serializer, corev1.SchemeGroupVersion).Decode(a.body, nil, &list); err != nil {
			t.Errorf("%s: decode list: %v: %s", a.req, err, printable(a.body))
			return
		}
		// A continue token holds the key the next page starts after, and
		// the view hands out none.
		if list.Continue != "" || list.RemainingItemCount != nil {
			tok, _ := base64.RawURLEncoding.DecodeString(strings.TrimRight(list.Continue, "="))
			t.Errorf("%s: a page: continue token %s, remainingItemCount %v", a.req, tok, list.RemainingItemCount)
		}
		for i := range list.Items {
			checkShown(t, a.req, "", &list.Items[i])
		}
		return
	}
	// The client's Services: a complete watch starts from none, one that
	// continues from what was in the view when it began.
	holds := map[string]bool{}
	complete := a.req.query.Get("sendInitialEvents") == "true" ||
		(!a.req.query.Has("sendInitialEvents") && (a.req.query.Get("resourceVersion") == "" || a.req.query.Get("resourceVersion") == "0"))
	if !complete {
		holds["own"], holds["own-leaving"] = true, true
	}
	for _, ev := range a.events {
		svc, isService := ev.Object.(*corev1.Service)
		switch {
		case ev.Type == watch.Error:
			st, isStatus := ev.Object.(*metav1.Status)
			if !isStatus {
				t.Errorf("%s: ERROR event with %T", a.req, ev.Object)
				continue
			}
			// The view ends a watch it cannot continue: only one resumed
			// from before the gate began.
			if st.Code != http.StatusGone || a.req.query.Get("resourceVersion") != rvOld {
				t.Errorf("%s: ERROR %d %s", a.req, st.Code, st.Message)
			}
			seen["watch ended 410"]++
			return
		case !isService:
			t.Errorf("%s: %s event with %T", a.req, ev.Type, ev.Object)
		case ev.Type == watch.Bookmark:
			if svc.Name != "" || svc.Namespace != "" || svc.UID != "" || len(svc.Labels) > 0 || svc.Spec.Type != "" || len(svc.Annotations) > 1 {
				t.Errorf("%s: bookmark carries a Service: %+v", a.req, svc)
			}
		default:
			checkShown(t, a.req, ev.Type, svc)
			if svc.Namespace == matrixNS {
				holds[svc.Name] = ev.Type != watch.Deleted
			}
		}
	}
	var got []string
	for name, held := range holds {
		if held {
			got = append(got, name)
		}
	}
	slices.Sort(got)
	if want := []string{"entering", "marker", "own"}; !slices.Equal(got, want) {
		t.Errorf("%s: the client holds %v after the changes, want %v (events %v)", a.req, got, want, eventNames(a.events))
	}
	seen["watch reached the view"]++
}

func eventNames(events []watch.Event) []string {
	var out []string
	for _, ev := range events {
		name := ""
		if s, ok := ev.Object.(*corev1.Service); ok {
			name = s.Name
		}
		out = append(out, string(ev.Type)+" "+name)
	}
	return out
}

// checkShown fails for a Service (list item or watch event) the CCM may not
// see in that state.
func checkShown(t *testing.T, r matrixRequest, typ watch.EventType, s *corev1.Service) {
	t.Helper()
	if s.Spec.LoadBalancerClass != nil {
		t.Errorf("%s: %s %s/%s shows its class", r, typ, s.Namespace, s.Name)
	}
	if s.Namespace != matrixNS || !slices.Contains([]string{"own", "own-leaving", "entering", "marker"}, s.Name) {
		t.Errorf("%s: %s of %s/%s, a Service outside the view", r, typ, s.Namespace, s.Name)
		return
	}
	if typ == watch.Deleted && (s.Spec.Type == corev1.ServiceTypeClusterIP || s.Annotations["canary"] != "") {
		t.Errorf("%s: DELETED %s carries the state it left the view in: %+v", r, s.Name, s)
	}
	if s.Name == "entering" && s.Spec.Type != corev1.ServiceTypeLoadBalancer && typ != watch.Deleted {
		t.Errorf("%s: %s entering shown before it entered the view: %+v", r, typ, s)
	}
}

func printable(b []byte) string {
	if len(b) > 600 {
		b = b[:600]
	}
	return strings.Map(func(r rune) rune {
		if r < 32 || r > 126 {
			return '.'
		}
		return r
	}, string(b))
}
