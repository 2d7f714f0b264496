package proxy

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
	// isSynced after the first list.
	isSynced bool
	// floor is the resourceVersion from which the history is complete (the
	// first list, a relist after a gap, or the latest forgotten deletion).
	floor uint64
	// horizon is the latest resourceVersion the history has seen.
	horizon uint64
	// shown are the Services that have been in the view since floor.
	shown map[string]*shownService
	// lastForget is when forget last looked.
	lastForget time.Time
	// advanced is closed (and replaced) whenever horizon moves.
	advanced chan struct{}
	// reflector runs the watch.
	reflector *cache.Reflector
}

// shownService is the history of one namespace/name.
type shownService struct {
	// first is the first resourceVersion at which the history saw the
	// current incarnation in the view (firstSet: it has been).
	first    uint64
	firstSet bool
	// goneAt is the resourceVersion at which an earlier incarnation that had
	// been in the view was deleted (0: none), goneTime when.
	goneAt   uint64
	goneTime time.Time
}

// held reports whether a client may hold the Service as it was at since.
func (s *shownService) held(since uint64) bool {
	return (s.firstSet && s.first <= since) || s.goneAt > since
}

// forgetAfter is how long a deleted Service stays in the history: longer than
// any watch the API server resumes (its watch cache and etcd compaction keep
// minutes).
const forgetAfter = 30 * time.Minute

// historyWait bounds how long a watch waits for the history to reach the
// event it decides on (the history's own watch brings the same event).
const historyWait = 2 * time.Second

var _ cache.Store = (*serviceHistory)(nil)
var _ cache.ResourceVersionUpdater = (*serviceHistory)(nil)

func newServiceHistory(cfg *rest.Config, view serviceView) (*serviceHistory, error) {
	base, err := upstreamURL(cfg)
	if err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	src := &serviceSource{base: base, client: hc, userAgent: rest.DefaultKubernetesUserAgent() + " (ccm-gate Service history)"}
	h := &serviceHistory{view: view, shown: map[string]*shownService{}, advanced: make(chan struct{})}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			// A consistent read in pages.
			o.ResourceVersion, o.ResourceVersionMatch = "", ""
			if o.Limit == 0 || o.Limit > cachePageSize {
				o.Limit = cachePageSize
			}
			return src.list(ctx, o)
		},
		WatchFuncWithContext: src.watch,
	}
	h.reflector = cache.NewReflectorWithOptions(lw, &historyService{}, h, cache.ReflectorOptions{Name: "ccm-gate Service history"})
	return h, nil
}

func (h *serviceHistory) run(ctx context.Context) { h.reflector.RunWithContext(ctx) }

func (h *serviceHistory) synced() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.isSynced
}

// waitSynced waits for the first list.
func (h *serviceHistory) waitSynced(ctx context.Context) bool {
	for {
		h.mu.Lock()
		synced, advanced := h.isSynced, h.advanced
		h.mu.Unlock()
		if synced {
			return true
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return false
		}
	}
}

// mayHaveShown reports whether the Service key may have been in the view at
// resourceVersion since, deciding on an event at resourceVersion at: it waits
// (briefly) until the history has seen that event, so that it is complete up
// to since. It is true whenever the history cannot rule it out.
func (h *serviceHistory) mayHaveShown(key string, since, at uint64) bool {
	timeout := time.NewTimer(historyWait)
	defer timeout.Stop()
	for {
		h.mu.Lock()
		if h.isSynced && h.horizon >= at && h.horizon >= since {
			s, shown := h.shown[key]
			held := since < h.floor || (shown && s.held(since))
			h.mu.Unlock()
			return held
		}
		advanced := h.advanced
		h.mu.Unlock()
		select {
		case <-advanced:
		case <-timeout.C:
			return true
		}
	}
}

// advance moves the horizon; called with h.mu held.
func (h *serviceHistory) advance(rv uint64) {
	if rv > h.horizon {
		h.horizon = rv
		close(h.advanced)
		h.advanced = make(chan struct{})
	}
}

// record notes one version of a Service; called with h.mu held.
func (h *serviceHistory) record(obj any, deleted bool) {
	s, ok := obj.(*historyService)
	if !ok {
		return
	}
	f := s.facts
	rv, _ := parseResourceVersion(f.resourceVersion)
	h.advance(rv)
	key := f.key()
	e, known := h.shown[key]
	switch {
	case deleted && known && e.firstSet:
		e.firstSet, e.goneAt, e.goneTime = false, rv, time.Now()
	case !deleted && h.view.shows(f):
		if !known {
			e = &shownService{}
			h.shown[key] = e
		}
		if !e.firstSet || rv < e.first {
			e.first, e.firstSet = rv, true
		}
	}
	h.forget()
}

// forget drops what is older than forgetAfter about deleted Services and
// raises the floor past it.
func (h *serviceHistory) forget() {
	now := time.Now()
	if now.Sub(h.lastForget) < time.Minute {
		return
	}
	h.lastForget = now
	cutoff := now.Add(-forgetAfter)
	for key, e := range h.shown {
		if e.goneAt == 0 || !e.goneTime.Before(cutoff) {
			continue
		}
		if e.goneAt > h.floor {
			h.floor = e.goneAt
		}
		e.goneAt = 0
		if !e.firstSet {
			delete(h.shown, key)
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
	rv, _ := parseResourceVersion(resourceVersion)
	present := map[string]struct{}{}
	for _, obj := range items {
		h.record(obj, false)
		if s, ok := obj.(*historyService); ok {
			present[s.facts.key()] = struct{}{}
		}
	}
	now := time.Now()
	for key, e := range h.shown {
		if _, ok := present[key]; !ok && e.firstSet {
			// Deleted while the watch was away, at some version before the list.
			e.firstSet, e.goneAt, e.goneTime = false, rv, now
		}
	}
	h.floor = rv
	h.isSynced = true
	close(h.advanced) // wakes waitSynced even when the horizon stays
	h.advanced = make(chan struct{})
	h.advance(rv)
	return nil
}

// UpdateResourceVersion implements cache.ResourceVersionUpdater (bookmarks).
func (h *serviceHistory) UpdateResourceVersion(resourceVersion string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rv, _ := parseResourceVersion(resourceVersion)
	h.advance(rv)
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
