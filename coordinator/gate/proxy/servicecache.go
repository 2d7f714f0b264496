package proxy

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// serviceHistory remembers which Services have been in the view since the
// gate started watching them, so that a resumed watch does not tell its
// client about a Service that was never in the view: when such a Service
// changes, the gate cannot see from the event whether the client holds it,
// and without this history it would have to send a DELETED (harmless for an
// informer, which ignores unknown deletions, but it names a foreign Service).
//
// It holds only keys: about a hundred bytes per Service ever in the view.
type serviceHistory struct {
	view serviceView

	mu sync.Mutex
	// synced after the first list.
	synced bool
	// floor is the resourceVersion from which the history is complete (the
	// first list, a relist after a gap, or the latest forgotten deletion).
	floor uint64
	// horizon is the latest resourceVersion the history has seen.
	horizon uint64
	// shown are the Services that were in the view at some version since
	// floor; deleted ones are kept until forgetAfter has passed.
	shown   map[string]struct{}
	deleted map[string]deletion
	// reflector runs the watch.
	reflector *cache.Reflector
}

type deletion struct {
	at time.Time
	rv uint64
}

// forgetAfter is how long a deleted Service stays in the history: longer than
// any watch the API server resumes (its watch cache and etcd compaction keep
// minutes).
const forgetAfter = 30 * time.Minute

var _ cache.Store = (*serviceHistory)(nil)
var _ cache.ResourceVersionUpdater = (*serviceHistory)(nil)

func newServiceHistory(cfg *rest.Config, view serviceView) (*serviceHistory, error) {
	c := rest.CopyConfig(cfg)
	c.ContentType = contentTypeProtobuf
	c.AcceptContentTypes = contentTypeProtobuf + "," + contentTypeJSON
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	services := cs.CoreV1().Services(metav1.NamespaceAll)
	h := &serviceHistory{view: view, shown: map[string]struct{}{}, deleted: map[string]deletion{}}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			// Read in pages, each stripped to what the history needs.
			o.ResourceVersion, o.ResourceVersionMatch = "", ""
			if o.Limit == 0 || o.Limit > cachePageSize {
				o.Limit = cachePageSize
			}
			l, err := services.List(ctx, o)
			if err != nil {
				return nil, err
			}
			for i := range l.Items {
				l.Items[i] = *stripService(&l.Items[i])
			}
			return l, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := services.Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
				if s, ok := ev.Object.(*corev1.Service); ok && ev.Type != watch.Bookmark {
					ev.Object = stripService(s)
				}
				return ev, true
			}), nil
		},
	}
	h.reflector = cache.NewReflectorWithOptions(lw, &corev1.Service{}, h, cache.ReflectorOptions{Name: "ccm-gate services"})
	return h, nil
}

// stripService keeps what the view decides on.
func stripService(s *corev1.Service) *corev1.Service {
	out := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
		Name: s.Name, Namespace: s.Namespace, ResourceVersion: s.ResourceVersion,
	}}
	out.Spec.Type = s.Spec.Type
	out.Spec.LoadBalancerClass = s.Spec.LoadBalancerClass
	for _, f := range s.Finalizers {
		if f == LoadBalancerCleanupFinalizer {
			out.Finalizers = []string{f}
		}
	}
	return out
}

func factsOf(s *corev1.Service) serviceFacts {
	f := serviceFacts{
		namespace: s.Namespace, name: s.Name, uid: string(s.UID), resourceVersion: s.ResourceVersion,
		typ: string(s.Spec.Type), cleanup: slices.Contains(s.Finalizers, LoadBalancerCleanupFinalizer),
	}
	if s.Spec.LoadBalancerClass != nil {
		f.class, f.hasClass = *s.Spec.LoadBalancerClass, true
	}
	return f
}

func (h *serviceHistory) run(ctx context.Context) { h.reflector.RunWithContext(ctx) }

// mayHaveShown reports whether the Service key may have been in the view at
// resourceVersion since (true whenever the history cannot rule it out).
func (h *serviceHistory) mayHaveShown(key string, since uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.synced || since < h.floor || since > h.horizon {
		return true
	}
	_, shown := h.shown[key]
	return shown
}

// record notes one version of a Service; called with h.mu held.
func (h *serviceHistory) record(obj any, deleted bool) {
	s, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	f := factsOf(s)
	rv, _ := parseResourceVersion(f.resourceVersion)
	if rv > h.horizon {
		h.horizon = rv
	}
	key := f.key()
	if h.view.shows(f) {
		h.shown[key] = struct{}{}
	}
	if _, shown := h.shown[key]; shown && deleted {
		h.deleted[key] = deletion{at: time.Now(), rv: rv}
	} else if !deleted {
		delete(h.deleted, key)
	}
	h.forget()
}

// forget drops deleted Services older than forgetAfter and raises the floor
// past them.
func (h *serviceHistory) forget() {
	cutoff := time.Now().Add(-forgetAfter)
	for key, d := range h.deleted {
		if d.at.Before(cutoff) {
			delete(h.deleted, key)
			delete(h.shown, key)
			if d.rv > h.floor {
				h.floor = d.rv
			}
		}
	}
}

// Add implements cache.Store.
func (h *serviceHistory) Add(obj any) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.record(obj, false)
	return nil
}

// Update implements cache.Store.
func (h *serviceHistory) Update(obj any) error { return h.Add(obj) }

// Delete implements cache.Store.
func (h *serviceHistory) Delete(obj any) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.record(obj, true)
	return nil
}

// Replace implements cache.Store: the first list, or a relist after the watch
// lost events. Nothing is forgotten, but the history is complete only from
// the list on.
func (h *serviceHistory) Replace(items []any, resourceVersion string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	present := map[string]struct{}{}
	for _, obj := range items {
		h.record(obj, false)
		if s, ok := obj.(*corev1.Service); ok {
			present[s.Namespace+"/"+s.Name] = struct{}{}
		}
	}
	now := time.Now()
	for key := range h.shown {
		if _, ok := present[key]; !ok {
			if _, gone := h.deleted[key]; !gone {
				h.deleted[key] = deletion{at: now}
			}
		}
	}
	rv, _ := parseResourceVersion(resourceVersion)
	h.floor = rv
	if rv > h.horizon {
		h.horizon = rv
	}
	h.synced = true
	return nil
}

// UpdateResourceVersion implements cache.ResourceVersionUpdater (bookmarks).
func (h *serviceHistory) UpdateResourceVersion(resourceVersion string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rv, _ := parseResourceVersion(resourceVersion); rv > h.horizon {
		h.horizon = rv
	}
}

// The reflector never reads the store back.

// List implements cache.Store.
func (h *serviceHistory) List() []any { return nil }

// ListKeys implements cache.Store.
func (h *serviceHistory) ListKeys() []string { return nil }

// Get implements cache.Store.
func (h *serviceHistory) Get(any) (any, bool, error) { return nil, false, nil }

// GetByKey implements cache.Store.
func (h *serviceHistory) GetByKey(string) (any, bool, error) { return nil, false, nil }

// Resync implements cache.Store.
func (h *serviceHistory) Resync() error { return nil }
