package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"
	servicehelper "k8s.io/cloud-provider/service/helpers"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
)

const (
	// ownClass is the class of the gates under test, awsClass another CCM's.
	ownClass = "hybridccm.io/hcloud"
	awsClass = "hybridccm.io/aws"
)

// svcSpec describes a test Service.
type svcSpec struct {
	name string
	// typ is the Service type; empty: LoadBalancer.
	typ corev1.ServiceType
	// class is spec.loadBalancerClass; nil: none.
	class *string
	// cleanup puts the load-balancer cleanup finalizer on it.
	cleanup bool
	// labels are extra labels.
	labels map[string]string
}

func (s svcSpec) service(ns string) *corev1.Service {
	typ := s.typ
	if typ == "" {
		typ = corev1.ServiceTypeLoadBalancer
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns, Labels: map[string]string{"app": s.name}},
		Spec: corev1.ServiceSpec{
			Type: typ, LoadBalancerClass: s.class,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for k, v := range s.labels {
		svc.Labels[k] = v
	}
	if s.cleanup {
		svc.Finalizers = []string{service.LoadBalancerCleanupFinalizer}
	}
	return svc
}

// serviceFixture creates a namespace with the Services and removes them (and
// their finalizers: nothing else will) at the end.
func serviceFixture(t *testing.T, ns string, specs ...svcSpec) {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, s := range specs {
		if _, err := env.Client.CoreV1().Services(ns).Create(ctx, s.service(ns), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Service %s: %v", s.name, err)
		}
	}
	t.Cleanup(func() { deleteServices(t, ns) })
}

// resetServices replaces the Services of ns with specs.
func resetServices(t *testing.T, ns string, specs ...svcSpec) {
	t.Helper()
	ctx := context.Background()
	deleteServices(t, ns)
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := env.Client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, err
	}); err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if _, err := env.Client.CoreV1().Services(ns).Create(ctx, s.service(ns), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Service %s: %v", s.name, err)
		}
	}
}

func deleteServices(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	l, err := env.Client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	for _, s := range l.Items {
		if len(s.Finalizers) > 0 {
			_, _ = env.Client.CoreV1().Services(ns).Patch(ctx, s.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		}
		if err := env.Client.CoreV1().Services(ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// contentTypes are the encodings a CCM's client may use.
var contentTypes = map[string]string{"json": "application/json", "protobuf": "application/vnd.kubernetes.protobuf"}

func (g *gate) clientFor(t *testing.T, contentType string) kubernetes.Interface {
	t.Helper()
	cfg := g.config()
	cfg.ContentType = contentType
	return kubernetes.NewForConfigOrDie(cfg)
}

func serviceNames(items []corev1.Service) []string {
	out := make([]string, 0, len(items))
	for _, s := range items {
		out = append(out, s.Namespace+"/"+s.Name)
	}
	slices.Sort(out)
	return out
}

// noClass fails when the view shows a class.
func noClass(t *testing.T, items ...corev1.Service) {
	t.Helper()
	for _, s := range items {
		if s.Spec.LoadBalancerClass != nil {
			t.Fatalf("Service %s/%s shown with class %q", s.Namespace, s.Name, *s.Spec.LoadBalancerClass)
		}
	}
}

func TestServiceViewList(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	serviceFixture(t, "svc-list",
		svcSpec{name: "own", class: ptr.To(ownClass), labels: map[string]string{"tier": "web"}},
		svcSpec{name: "own-2", class: ptr.To(ownClass)},
		svcSpec{name: "aws", class: ptr.To(awsClass), labels: map[string]string{"tier": "web"}},
		svcSpec{name: "classless"},
		svcSpec{name: "cluster-ip", typ: corev1.ServiceTypeClusterIP},
		svcSpec{name: "node-port", typ: corev1.ServiceTypeNodePort},
		svcSpec{name: "leftover", typ: corev1.ServiceTypeClusterIP, cleanup: true},
	)
	serviceFixture(t, "svc-list-2", svcSpec{name: "own-3", class: ptr.To(ownClass)})
	gates := []struct {
		name string
		// edit configures the gate.
		edit func(*proxy.Config)
		// want are the Services of namespace svc-list it shows.
		want []string
	}{
		{name: "own class", edit: func(c *proxy.Config) { c.LoadBalancerClass = ownClass },
			want: []string{"svc-list/leftover", "svc-list/own", "svc-list/own-2"}},
		{name: "own class and the default", edit: func(c *proxy.Config) { c.LoadBalancerClass, c.DefaultLoadBalancerClass = ownClass, true },
			want: []string{"svc-list/classless", "svc-list/leftover", "svc-list/own", "svc-list/own-2"}},
		{name: "no class (load balancers off)"},
	}
	for _, gc := range gates {
		t.Run(gc.name, func(t *testing.T) {
			g := startGate(t, "svc-hc", gc.edit)
			for ctName, ct := range contentTypes {
				t.Run(ctName, func(t *testing.T) {
					cs := g.clientFor(t, ct)
					l, err := cs.CoreV1().Services("svc-list").List(ctx, metav1.ListOptions{})
					if err != nil {
						t.Fatal(err)
					}
					noClass(t, l.Items...)
					if got := serviceNames(l.Items); !slices.Equal(got, gc.want) && len(got)+len(gc.want) > 0 {
						t.Fatalf("list: %v, want %v", got, gc.want)
					}
					if l.ResourceVersion == "" {
						t.Fatal("list without resourceVersion")
					}
					all, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
					if err != nil {
						t.Fatal(err)
					}
					noClass(t, all.Items...)
					for _, s := range all.Items {
						if s.Namespace == "svc-list" && !slices.Contains(gc.want, s.Namespace+"/"+s.Name) {
							t.Fatalf("cluster-wide list shows %s", s.Name)
						}
					}
					if gc.edit != nil && !slices.Contains(serviceNames(all.Items), "svc-list-2/own-3") {
						t.Fatalf("cluster-wide list misses svc-list-2/own-3: %v", serviceNames(all.Items))
					}
					// Selectors are the API server's; the view narrows further.
					sel, err := cs.CoreV1().Services("svc-list").List(ctx, metav1.ListOptions{LabelSelector: "tier=web"})
					if err != nil {
						t.Fatal(err)
					}
					if got := serviceNames(sel.Items); gc.edit != nil && !slices.Equal(got, []string{"svc-list/own"}) {
						t.Fatalf("tier=web: %v", got)
					}
					byName, err := cs.CoreV1().Services("svc-list").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=aws"})
					if err != nil || len(byName.Items) != 0 {
						t.Fatalf("field selector on a foreign Service: %v %v", serviceNames(byName.Items), err)
					}
					// A pager's limit: one page, all of it, without a continue
					// token (it would name the key the next page starts
					// after) or remainingItemCount (it counts hidden Services).
					page, err := cs.CoreV1().Services("svc-list").List(ctx, metav1.ListOptions{Limit: 1})
					if err != nil {
						t.Fatal(err)
					}
					if got := serviceNames(page.Items); (!slices.Equal(got, gc.want) && len(got)+len(gc.want) > 0) || page.Continue != "" || page.RemainingItemCount != nil {
						t.Fatalf("limit 1: %v, continue %q, remaining %v; want %v in one page", got, page.Continue, page.RemainingItemCount, gc.want)
					}
					// A token (the view hands out none) is expired: a pager
					// lists again in full.
					if _, err := cs.CoreV1().Services("svc-list").List(ctx, metav1.ListOptions{Limit: 1, Continue: "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"}); !apierrors.IsResourceExpired(err) {
						t.Fatalf("continue token: want 410 Expired, got %v", err)
					}
					var paged []corev1.Service
					if err := pager.New(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
						return cs.CoreV1().Services("svc-list").List(ctx, o)
					}).EachListItem(ctx, metav1.ListOptions{Limit: 1}, func(o runtime.Object) error {
						paged = append(paged, *o.(*corev1.Service))
						return nil
					}); err != nil {
						t.Fatal(err)
					}
					if got := serviceNames(paged); !slices.Equal(got, gc.want) && len(got)+len(gc.want) > 0 {
						t.Fatalf("client-go pager: %v, want %v", got, gc.want)
					}
					// One Service: a foreign one does not exist.
					for _, name := range []string{"own", "aws", "classless", "cluster-ip", "leftover", "missing"} {
						s, err := cs.CoreV1().Services("svc-list").Get(ctx, name, metav1.GetOptions{})
						shown := slices.Contains(gc.want, "svc-list/"+name)
						switch {
						case shown && err != nil:
							t.Fatalf("get %s: %v", name, err)
						case shown:
							noClass(t, *s)
						case !apierrors.IsNotFound(err):
							t.Fatalf("get %s: want NotFound, got %v", name, err)
						}
					}
				})
			}
		})
	}

	g := startGate(t, "svc-hc", func(c *proxy.Config) { c.LoadBalancerClass = ownClass })
	cs := g.client(t)
	refused := []struct {
		name string
		// do is a request the view never forwards.
		do func() error
		// check classifies the error.
		check func(error) bool
	}{
		{name: "create", check: apierrors.IsForbidden, do: func() error {
			_, err := cs.CoreV1().Services("svc-list").Create(ctx, svcSpec{name: "new", class: ptr.To(ownClass)}.service("svc-list"), metav1.CreateOptions{})
			return err
		}},
		{name: "delete own", check: apierrors.IsForbidden, do: func() error {
			return cs.CoreV1().Services("svc-list").Delete(ctx, "own", metav1.DeleteOptions{})
		}},
		{name: "deletecollection", check: apierrors.IsForbidden, do: func() error {
			return cs.CoreV1().RESTClient().Delete().Namespace("svc-list").Resource("services").Do(ctx).Error()
		}},
		{name: "proxy to own", check: apierrors.IsForbidden, do: func() error {
			return cs.CoreV1().RESTClient().Get().Namespace("svc-list").Resource("services").Name("own").SubResource("proxy").Do(ctx).Error()
		}},
	}
	for _, tc := range refused {
		t.Run(tc.name+" is refused", func(t *testing.T) {
			if err := tc.do(); !tc.check(err) {
				t.Fatalf("got %v", err)
			}
		})
	}
	t.Run("a Service outside the view is answered as one that does not exist", func(t *testing.T) {
		for _, accept := range []string{"application/json", "application/vnd.kubernetes.protobuf"} {
			code, body, ctype := rawServiceGet(t, g.url+"/api/v1/namespaces/svc-list/services/aws", accept)
			missingCode, missingBody, missingType := rawServiceGet(t, g.url+"/api/v1/namespaces/svc-list/services/aaa", accept)
			if code != http.StatusNotFound || code != missingCode || ctype != missingType || strings.ReplaceAll(body, "aws", "aaa") != missingBody {
				t.Fatalf("%s: outside the view %d %s %q, missing %d %s %q", accept, code, ctype, body, missingCode, missingType, missingBody)
			}
		}
	})
	t.Run("a table is answered with objects", func(t *testing.T) {
		code, body, ctype := rawServiceGet(t, g.url+"/api/v1/namespaces/svc-list/services", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
		var l corev1.ServiceList
		if code != http.StatusOK || ctype != "application/json" || json.Unmarshal([]byte(body), &l) != nil || len(l.Items) != 3 {
			t.Fatalf("%d %s %.200s", code, ctype, body)
		}
	})
	t.Run("metadata only is not acceptable", func(t *testing.T) {
		code, body, _ := rawServiceGet(t, g.url+"/api/v1/namespaces/svc-list/services", "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io")
		if code != http.StatusNotAcceptable {
			t.Fatalf("%d %s", code, body)
		}
	})
	t.Run("repeated watch parameter is refused", func(t *testing.T) {
		code, _, _ := rawServiceGet(t, g.url+"/api/v1/namespaces/svc-list/services?watch=false&watch=true", "")
		if code != http.StatusBadRequest {
			t.Fatalf("status %d, want 400", code)
		}
	})
}

func rawServiceGet(t *testing.T, url, accept string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
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
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Content-Type")
}

// TestServiceViewWatch follows Services through a raw WatchList, its bookmark
// and a watch resumed from it, while an admin moves them in and out of the
// view.
func TestServiceViewWatch(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "svc-watch"
	specs := []svcSpec{
		{name: "own", class: ptr.To(ownClass)},
		{name: "aws", class: ptr.To(awsClass)},
		{name: "ip", typ: corev1.ServiceTypeClusterIP},
		{name: "own-leaving", class: ptr.To(ownClass), cleanup: true},
	}
	serviceFixture(t, ns, specs...)
	admin := env.Client.CoreV1().Services(ns)
	patch := func(name, p string) {
		t.Helper()
		if _, err := admin.Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatalf("patch %s: %v", name, err)
		}
	}
	for _, nodeCache := range []bool{true, false} {
		// The Service history is no cache: --cache=false keeps it.
		name := map[bool]string{true: "with the node cache", false: "without the node cache"}[nodeCache]
		t.Run(name, func(t *testing.T) {
			g := startGate(t, "svc-hc", func(c *proxy.Config) {
				c.LoadBalancerClass = ownClass
				c.DisableCache = !nodeCache
			})
			for ctName, ct := range contentTypes {
				t.Run(ctName, func(t *testing.T) {
					resetServices(t, ns, specs...)
					cs := g.clientFor(t, ct)
					w, err := cs.CoreV1().Services(ns).Watch(ctx, metav1.ListOptions{
						SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
					})
					if err != nil {
						t.Fatal(err)
					}
					initial, rv := readUntilInitialEventsEnd(t, w)
					w.Stop()
					if want := []string{"ADDED own", "ADDED own-leaving"}; !slices.Equal(initial, want) {
						t.Fatalf("initial events %v, want %v", initial, want)
					}
					// Resume from the bookmark, as an informer does after a
					// watch ends, and change things.
					w, err = cs.CoreV1().Services(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
					if err != nil {
						t.Fatal(err)
					}
					defer w.Stop()
					patch("aws", `{"metadata":{"annotations":{"touch":"1"}}}`)
					patch("own", `{"metadata":{"annotations":{"touch":"1"}}}`)
					patch("own-leaving", `{"spec":{"type":"ClusterIP"}}`)
					patch("own-leaving", `{"metadata":{"finalizers":null}}`)
					patch("ip", `{"spec":{"type":"LoadBalancer","loadBalancerClass":"`+ownClass+`"}}`)
					patch("aws", `{"metadata":{"annotations":{"touch":"2"}}}`)
					// The history tells the gate that the client cannot hold
					// aws (never in the view): nothing about it arrives. own-leaving
					// stays while its finalizer holds it, then leaves; ip enters
					// as the MODIFIED it is (an informer adds what it does not
					// hold).
					want := []string{"MODIFIED own", "MODIFIED own-leaving", "DELETED own-leaving", "MODIFIED ip"}
					if got := readEvents(t, w, len(want), 2*time.Second); !slices.Equal(got, want) {
						t.Fatalf("resumed watch: %v, want %v", got, want)
					}
				})
			}
		})
	}
	resetServices(t, ns, specs...)

	t.Run("legacy watch path", func(t *testing.T) {
		g := startGate(t, "svc-hc", func(c *proxy.Config) { c.LoadBalancerClass = ownClass })
		cs := g.client(t)
		rc := cs.CoreV1().RESTClient()
		w, err := rc.Get().AbsPath("/api/v1/watch/namespaces", ns, "services").Param("resourceVersion", "0").Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		got := readEvents(t, w, 2, time.Second)
		slices.Sort(got)
		if want := []string{"ADDED own", "ADDED own-leaving"}; !slices.Equal(got, want) {
			t.Fatalf("legacy watch: %v, want %v", got, want)
		}
		one, err := rc.Get().AbsPath("/api/v1/watch/namespaces", ns, "services", "aws").Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer one.Stop()
		if got := readEvents(t, one, 0, time.Second); len(got) != 0 {
			t.Fatalf("watch of a foreign Service: %v", got)
		}
	})
}

// readUntilInitialEventsEnd returns the initial events ("TYPE name") and the
// resourceVersion of the bookmark that ends them.
func readUntilInitialEventsEnd(t *testing.T, w watch.Interface) ([]string, string) {
	t.Helper()
	var got []string
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch ended before the initial-events-end bookmark")
			}
			s, isService := ev.Object.(*corev1.Service)
			if !isService {
				t.Fatalf("event %s %T", ev.Type, ev.Object)
			}
			if ev.Type == watch.Bookmark {
				if s.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
					slices.Sort(got)
					return got, s.ResourceVersion
				}
				continue
			}
			noClass(t, *s)
			got = append(got, string(ev.Type)+" "+s.Name)
		case <-timeout:
			t.Fatalf("no initial-events-end bookmark; got %v", got)
		}
	}
}

// readEvents reads n Service events ("TYPE name", bookmarks skipped), then
// waits quiet for whatever else comes.
func readEvents(t *testing.T, w watch.Interface, n int, quiet time.Duration) []string {
	t.Helper()
	var got []string
	deadline := time.After(30 * time.Second)
	for {
		wait := deadline
		if len(got) >= n {
			wait = time.After(quiet)
		}
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return got
			}
			if ev.Type == watch.Bookmark {
				continue
			}
			s, isService := ev.Object.(*corev1.Service)
			if !isService {
				t.Fatalf("event %s %+v", ev.Type, ev.Object)
			}
			noClass(t, *s)
			got = append(got, string(ev.Type)+" "+s.Name)
		case <-wait:
			return got
		}
	}
}

// TestServiceViewInformer runs a Service informer, as the service controller
// does, through the gate with WatchList on and off: a Service that leaves the
// view leaves the informer, one that enters it arrives, a foreign one never
// reaches a handler, not even as a deletion.
func TestServiceViewInformer(t *testing.T) {
	needEnv(t)
	for _, watchList := range []bool{true, false} {
		name := map[bool]string{true: "watchlist", false: "list-watch"}[watchList]
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ns := "svc-inf-" + name
			serviceFixture(t, ns,
				svcSpec{name: "own", class: ptr.To(ownClass)},
				svcSpec{name: "own-finalized", class: ptr.To(ownClass), cleanup: true},
				svcSpec{name: "aws", class: ptr.To(awsClass)},
				svcSpec{name: "ip", typ: corev1.ServiceTypeClusterIP},
			)
			setWatchList(t, watchList)
			g := startGate(t, "svc-hc", func(c *proxy.Config) { c.LoadBalancerClass = ownClass })
			inf := startServiceInformer(t, ctx, g.clientFor(t, contentTypes["protobuf"]), ns)
			inf.waitKeys(t, ctx, "own", "own-finalized")

			admin := env.Client.CoreV1().Services(ns)
			patch := func(name, p string) {
				t.Helper()
				if _, err := admin.Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
					t.Fatalf("patch %s: %v", name, err)
				}
			}
			// A ClusterIP that becomes a LoadBalancer of this class arrives.
			patch("ip", `{"spec":{"type":"LoadBalancer","loadBalancerClass":"`+ownClass+`"}}`)
			inf.waitKeys(t, ctx, "ip", "own", "own-finalized")
			// Type changed: gone (no finalizer holds it).
			patch("own", `{"spec":{"type":"ClusterIP"}}`)
			inf.waitKeys(t, ctx, "ip", "own-finalized")
			// Type changed with the finalizer on: it stays, as a ClusterIP,
			// until the finalizer goes.
			patch("own-finalized", `{"spec":{"type":"NodePort"}}`)
			if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				s, ok := inf.get("own-finalized")
				return ok && s.Spec.Type == corev1.ServiceTypeNodePort, nil
			}); err != nil {
				t.Fatal("own-finalized did not follow its type change")
			}
			patch("own-finalized", `{"metadata":{"finalizers":null}}`)
			inf.waitKeys(t, ctx, "ip")
			// Foreign Services come and go unseen.
			patch("aws", `{"metadata":{"annotations":{"x":"y"}}}`)
			if _, err := admin.Create(ctx, svcSpec{name: "aws-new", class: ptr.To(awsClass)}.service(ns), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := admin.Delete(ctx, "aws", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			// A marker after them: once it arrives, they have passed.
			if _, err := admin.Create(ctx, svcSpec{name: "marker", class: ptr.To(ownClass)}.service(ns), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			inf.waitKeys(t, ctx, "ip", "marker")
			if foreign := inf.handled("aws", "aws-new"); len(foreign) > 0 {
				t.Fatalf("foreign Services reached the handler: %v", foreign)
			}
			for _, s := range inf.all() {
				noClass(t, *s)
			}
		})
	}
}

// serviceInformer is a client-go Service informer with handlers that record
// which Services reached them.
type serviceInformer struct {
	inf cache.SharedIndexInformer
	mu  sync.Mutex
	// events are the handler calls per Service name.
	events map[string][]string
}

func startServiceInformer(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns string) *serviceInformer {
	t.Helper()
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	si := &serviceInformer{inf: factory.Core().V1().Services().Informer(), events: map[string][]string{}}
	record := func(what string) func(obj any) {
		return func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*corev1.Service); ok {
				si.mu.Lock()
				si.events[s.Name] = append(si.events[s.Name], what)
				si.mu.Unlock()
			}
		}
	}
	if _, err := si.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record("add"),
		UpdateFunc: func(_, obj any) { record("update")(obj) },
		DeleteFunc: record("delete"),
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	t.Cleanup(func() {
		close(stop)
		factory.Shutdown()
	})
	if !cache.WaitForCacheSync(ctx.Done(), si.inf.HasSynced) {
		t.Fatal("Service informer never synced through the gate")
	}
	return si
}

func (si *serviceInformer) keys() []string {
	var out []string
	for _, o := range si.inf.GetStore().List() {
		out = append(out, o.(*corev1.Service).Name)
	}
	slices.Sort(out)
	return out
}

func (si *serviceInformer) waitKeys(t *testing.T, ctx context.Context, want ...string) {
	t.Helper()
	slices.Sort(want)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return slices.Equal(si.keys(), want), nil
	}); err != nil {
		t.Fatalf("informer holds %v, want %v", si.keys(), want)
	}
}

func (si *serviceInformer) get(name string) (*corev1.Service, bool) {
	for _, o := range si.inf.GetStore().List() {
		if s := o.(*corev1.Service); s.Name == name {
			return s, true
		}
	}
	return nil, false
}

func (si *serviceInformer) all() []*corev1.Service {
	var out []*corev1.Service
	for _, o := range si.inf.GetStore().List() {
		out = append(out, o.(*corev1.Service))
	}
	return out
}

// handled returns the handler calls for the named Services.
func (si *serviceInformer) handled(names ...string) map[string][]string {
	si.mu.Lock()
	defer si.mu.Unlock()
	out := map[string][]string{}
	for _, n := range names {
		if ev := si.events[n]; len(ev) > 0 {
			out[n] = slices.Clone(ev)
		}
	}
	return out
}

// TestServiceViewWrites sends the writes a CCM makes through the view (and a
// few it should not) and checks that none of them loses the class.
func TestServiceViewWrites(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const ns = "svc-write"
	serviceFixture(t, ns,
		svcSpec{name: "own", class: ptr.To(ownClass)},
		svcSpec{name: "aws", class: ptr.To(awsClass)},
		svcSpec{name: "classless"},
		svcSpec{name: "leftover-json", typ: corev1.ServiceTypeClusterIP, cleanup: true},
		svcSpec{name: "leftover-protobuf", typ: corev1.ServiceTypeClusterIP, cleanup: true},
	)
	admin := env.Client.CoreV1().Services(ns)
	stored := func(name string) *corev1.Service {
		t.Helper()
		s, err := admin.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	keepsClass := func(name, class string) *corev1.Service {
		t.Helper()
		s := stored(name)
		if s.Spec.LoadBalancerClass == nil || *s.Spec.LoadBalancerClass != class {
			t.Fatalf("Service %s lost its class: %v", name, s.Spec.LoadBalancerClass)
		}
		return s
	}
	g := startGate(t, "svc-hc", func(c *proxy.Config) { c.LoadBalancerClass = ownClass })
	for ctName, ct := range contentTypes {
		t.Run(ctName, func(t *testing.T) {
			cs := g.clientFor(t, ct)
			svcs := cs.CoreV1().Services(ns)
			view := func() *corev1.Service {
				t.Helper()
				s, err := svcs.Get(ctx, "own", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				noClass(t, *s)
				return s
			}
			t.Run("PUT status", func(t *testing.T) {
				s := view()
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}}
				out, err := svcs.UpdateStatus(ctx, s, metav1.UpdateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				noClass(t, *out)
				if got := keepsClass("own", ownClass); len(got.Status.LoadBalancer.Ingress) != 1 {
					t.Fatalf("status %+v", got.Status)
				}
			})
			t.Run("PUT with the class restored", func(t *testing.T) {
				s := view()
				s.Labels["put"] = ctName
				out, err := svcs.Update(ctx, s, metav1.UpdateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				noClass(t, *out)
				if got := keepsClass("own", ownClass); got.Labels["put"] != ctName {
					t.Fatalf("labels %v", got.Labels)
				}
			})
			t.Run("unconditional PUT", func(t *testing.T) {
				s := view()
				s.ResourceVersion = ""
				s.Labels["unconditional"] = ctName
				if _, err := svcs.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				if got := keepsClass("own", ownClass); got.Labels["unconditional"] != ctName {
					t.Fatalf("labels %v", got.Labels)
				}
			})
			t.Run("PUT setting another class is refused", func(t *testing.T) {
				s := view()
				s.Spec.LoadBalancerClass = ptr.To(awsClass)
				if _, err := svcs.Update(ctx, s, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "loadBalancerClass") {
					t.Fatalf("want Forbidden naming the class, got %v", err)
				}
				keepsClass("own", ownClass)
			})
			t.Run("the service controller's status and finalizer patches", func(t *testing.T) {
				s := view()
				withFinalizer := s.DeepCopy()
				withFinalizer.Finalizers = append(withFinalizer.Finalizers, service.LoadBalancerCleanupFinalizer)
				if _, err := servicehelper.PatchService(cs.CoreV1(), s, withFinalizer); err != nil {
					t.Fatal(err)
				}
				s = view()
				withStatus := s.DeepCopy()
				withStatus.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.20"}}
				if _, err := servicehelper.PatchService(cs.CoreV1(), s, withStatus); err != nil {
					t.Fatal(err)
				}
				got := keepsClass("own", ownClass)
				if !slices.Contains(got.Finalizers, service.LoadBalancerCleanupFinalizer) || got.Status.LoadBalancer.Ingress[0].IP != "192.0.2.20" {
					t.Fatalf("finalizers %v, status %+v", got.Finalizers, got.Status)
				}
				s = view()
				without := s.DeepCopy()
				without.Finalizers = nil
				if _, err := servicehelper.PatchService(cs.CoreV1(), s, without); err != nil {
					t.Fatal(err)
				}
				if got := keepsClass("own", ownClass); len(got.Finalizers) != 0 {
					t.Fatalf("finalizers %v", got.Finalizers)
				}
			})
			t.Run("merge patch", func(t *testing.T) {
				out, err := svcs.Patch(ctx, "own", types.MergePatchType, []byte(`{"metadata":{"annotations":{"merge":"`+ctName+`"}}}`), metav1.PatchOptions{})
				if err != nil {
					t.Fatal(err)
				}
				noClass(t, *out)
				keepsClass("own", ownClass)
			})
			t.Run("server-side apply of what the view shows", func(t *testing.T) {
				apply := `{"apiVersion":"v1","kind":"Service","metadata":{"name":"own","namespace":"` + ns + `","labels":{"apply":"` + ctName + `"}},` +
					`"spec":{"type":"LoadBalancer","ports":[{"name":"http","port":80,"protocol":"TCP"}]}}`
				out, err := svcs.Patch(ctx, "own", types.ApplyPatchType, []byte(apply), metav1.PatchOptions{FieldManager: "ccm-" + ctName, Force: ptr.To(true)})
				if err != nil {
					t.Fatal(err)
				}
				noClass(t, *out)
				keepsClass("own", ownClass)
			})
			t.Run("replacing the whole spec is the API server's to refuse", func(t *testing.T) {
				spec, _ := json.Marshal(view().Spec)
				_, err := svcs.Patch(ctx, "own", types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec","value":`+string(spec)+`}]`), metav1.PatchOptions{})
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "loadBalancerClass") {
					t.Fatalf("want Invalid (class immutable), got %v", err)
				}
				keepsClass("own", ownClass)
			})
			t.Run("Services outside the view are not found", func(t *testing.T) {
				for _, name := range []string{"aws", "classless"} {
					before := stored(name)
					_, err := svcs.Patch(ctx, name, types.StrategicMergePatchType, []byte(`{"metadata":{"finalizers":["`+service.LoadBalancerCleanupFinalizer+`"]}}`), metav1.PatchOptions{}, "status")
					if !apierrors.IsNotFound(err) {
						t.Fatalf("patch status of %s: want NotFound, got %v", name, err)
					}
					foreign := before.DeepCopy()
					foreign.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.1"}}
					if _, err := svcs.UpdateStatus(ctx, foreign, metav1.UpdateOptions{}); !apierrors.IsNotFound(err) {
						t.Fatalf("PUT status of %s: want NotFound, got %v", name, err)
					}
					if after := stored(name); after.ResourceVersion != before.ResourceVersion {
						t.Fatalf("Service %s changed through the view", name)
					}
				}
			})
			t.Run("a ClusterIP left with the finalizer is cleaned up, then gone", func(t *testing.T) {
				name := "leftover-" + ctName
				s, err := svcs.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				without := s.DeepCopy()
				without.Finalizers = nil
				if _, err := servicehelper.PatchService(cs.CoreV1(), s, without); err != nil {
					t.Fatal(err)
				}
				if _, err := svcs.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Fatalf("cleaned-up ClusterIP still in the view: %v", err)
				}
			})
		})
	}
}
