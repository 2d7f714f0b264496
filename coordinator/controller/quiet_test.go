package controller

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// Requests the suite's manager and Helm engine send the API server.
var managerRequests, helmRequests requestCounter

// requestCounter counts requests by what they do: "list nodes" (a LIST of
// all nodes, not a watch) and "helm <release>" (a read of Helm's release
// storage: its Secrets by label or by name).
type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if key := requestKey(r); key != "" {
			c.mu.Lock()
			if c.counts == nil {
				c.counts = map[string]int{}
			}
			c.counts[key]++
			c.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (c *requestCounter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[key]
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func requestKey(r *http.Request) string {
	if r.Method != http.MethodGet {
		return ""
	}
	q := r.URL.Query()
	if q.Get("watch") == "true" || q.Get("watch") == "1" {
		return ""
	}
	path := strings.TrimSuffix(r.URL.Path, "/")
	if path == "/api/v1/nodes" {
		return "list nodes"
	}
	dir, name, _ := strings.Cut(path[strings.Index(path, "/secrets")+1:], "/")
	if !strings.Contains(path, "/secrets") || dir != "secrets" {
		return ""
	}
	if rest, ok := strings.CutPrefix(name, "sh.helm.release.v1."); ok {
		if i := strings.LastIndex(rest, ".v"); i > 0 {
			return "helm " + rest[:i]
		}
	}
	if sel, err := labels.Parse(q.Get("labelSelector")); err == nil && name == "" {
		if owner, _ := sel.RequiresExactMatch(release.StorageOwnerLabel); owner == release.StorageOwner {
			rel, _ := sel.RequiresExactMatch(release.StorageNameLabel)
			return "helm " + rel
		}
	}
	return ""
}

// TestHealthyUnchangedReleaseIsQuiet: once a NativeCCM's release is deployed
// and its CCM healthy, the periodic health check and a node joining its
// platform read neither Helm's release history nor the list of all nodes;
// a requested reconcile does read the history (so the count can move).
func TestHealthyUnchangedReleaseIsQuiet(t *testing.T) {
	const name, platform = "quiet-a", "quiet-a"
	rel := v1.ReleasePrefix + name
	hcloudSecret(t)
	createNode(t, "quiet-a-1", platform, "hcloud://quiet-a-1")
	createNativeCCM(t, &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NativeCCMSpec{Platform: platform, Profile: name}})
	waitCondition(t, name, v1.HealthyCondition, metav1.ConditionTrue, v1.LeaseRenewedReason)
	first := waitCondition(t, name, meta.ReadyCondition, metav1.ConditionTrue, "")

	// The health check comes back by itself (half a lease duration after
	// the Lease would run out) and records the Lease's newer renewal.
	renewed := func(o *v1.NativeCCM) *metav1.MicroTime {
		if o.Status.Leader == nil {
			return nil
		}
		return o.Status.Leader.RenewTime
	}
	healthCheckAfter := func(what string, before *v1.NativeCCM) *v1.NativeCCM {
		var o *v1.NativeCCM
		eventually(t, what, func() (bool, string) {
			o = getNativeCCM(t, name)
			was, now := renewed(before), renewed(o)
			return was != nil && now != nil && now.After(was.Time), fmt.Sprintf("leader %+v", o.Status.Leader)
		})
		return o
	}
	// The counts start after one periodic check has written the status:
	// one NativeCCM is never reconciled twice at once, so every pass begun
	// around the install has ended by then. Such a pass may read the
	// history once, rightly: the manager's cache of Helm's Secrets can be
	// behind the install that just finished (unchangedRelease).
	settled := healthCheckAfter("a first periodic health check", first)
	helmReads, nodeLists := helmRequests.get("helm "+rel), managerRequests.get("list nodes")

	healthCheckAfter("a second periodic health check", settled)
	if n := helmRequests.get("helm " + rel); n != helmReads {
		t.Errorf("the health check of a healthy, unchanged release read its Helm history %d time(s)", n-helmReads)
	}

	// A node joins: counted from the cache, by the platform's index.
	createNode(t, "quiet-a-2", platform, "hcloud://quiet-a-2")
	eventually(t, "the second node counted", func() (bool, string) {
		o := getNativeCCM(t, name)
		return o.Status.Nodes == 2, fmt.Sprintf("nodes %d", o.Status.Nodes)
	})
	if n := helmRequests.get("helm " + rel); n != helmReads {
		t.Errorf("a node joining read the Helm history of %s %d time(s)", rel, n-helmReads)
	}
	if n := managerRequests.get("list nodes"); n != nodeLists {
		t.Errorf("a node joining made the coordinator LIST all nodes %d time(s)", n-nodeLists)
	}
	if o := getNativeCCM(t, name); o.Status.Release == nil || o.Status.Release.Revision != first.Status.Release.Revision {
		t.Errorf("release %+v, want revision %d unchanged", o.Status.Release, first.Status.Release.Revision)
	}

	// A requested reconcile checks everything again, the history included.
	token := time.Now().Format(time.RFC3339Nano)
	o := getNativeCCM(t, name)
	patch := client.MergeFrom(o.DeepCopy())
	if o.Annotations == nil {
		o.Annotations = map[string]string{}
	}
	o.Annotations[meta.ReconcileRequestAnnotation] = token
	if err := k8s.Patch(ctxT(t), o, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the requested reconcile", func() (bool, string) {
		o := getNativeCCM(t, name)
		return o.Status.LastHandledReconcileAt == token && o.Status.ObservedGeneration == o.Generation, o.Status.LastHandledReconcileAt
	})
	if n := helmRequests.get("helm " + rel); n == helmReads {
		t.Errorf("a requested reconcile did not read the Helm history of %s", rel)
	}
}
