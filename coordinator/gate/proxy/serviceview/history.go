package serviceview

import (
	"context"
	"net/url"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
)

// History follows every Service with the gate's own credentials and
// remembers when each Service entered and left the view, so that a watch can
// answer, on the first event it gets about a Service, whether its client may
// hold that Service from before the watch began: it does exactly when the
// Service was in the view just before that event (the event is the first
// about it since the client's resourceVersion, so nothing about it changed in
// between).
//
// It holds, per Service that has been in the view, its passages through it:
// about a hundred bytes each. Passages that ended longer than forgetAfter ago
// are forgotten.
type History struct {
	view View

	mu sync.Mutex
	// isSynced after the first list.
	isSynced bool
	// floor is the resourceVersion from which the history is exact: the
	// first list, a relist after the watch lost events, or the end of the
	// latest forgotten passage.
	floor uint64
	// horizon is the latest resourceVersion the history has seen: it has
	// seen every change of a Service up to it.
	horizon uint64
	// passages are the Services' passages through the view, oldest first.
	passages map[string][]passage
	// lastForget is when forget last looked.
	lastForget time.Time
	// advanced is closed (and replaced) whenever horizon moves.
	advanced chan struct{}
	// reflector runs the watch.
	reflector *cache.Reflector
}

// passage is a Service's stay in the view: in it from resourceVersion from
// to resourceVersion to (excluded; 0: still in it).
type passage struct {
	from, to uint64
	// uid is the Service's while it was in the view.
	uid string
	// left is when it left.
	left time.Time
}

// forgetAfter is how long a passage is kept after it ended: longer than any
// watch the API server resumes (its watch cache and etcd compaction keep
// minutes).
const forgetAfter = 30 * time.Minute

// historyWait bounds how long a watch waits for the history to reach the
// event it decides on (the history's own watch brings the same event).
const historyWait = 2 * time.Second

// historyPageSize bounds how many Services a page of the history's list
// holds (the node cache's pages are as large).
const historyPageSize = 250

var _ cache.Store = (*History)(nil)
var _ cache.ResourceVersionUpdater = (*History)(nil)

func NewHistory(cfg *rest.Config, base *url.URL, view View) (*History, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	src := &service.Source{Base: base, Client: hc, UserAgent: rest.DefaultKubernetesUserAgent() + " (ccm-gate Service history)"}
	h := &History{view: view, passages: map[string][]passage{}, advanced: make(chan struct{})}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			// A consistent read in pages.
			o.ResourceVersion, o.ResourceVersionMatch = "", ""
			if o.Limit == 0 || o.Limit > historyPageSize {
				o.Limit = historyPageSize
			}
			return src.List(ctx, o)
		},
		WatchFuncWithContext: src.Watch,
	}
	h.reflector = cache.NewReflectorWithOptions(lw, &service.HistoryService{}, h, cache.ReflectorOptions{Name: "ccm-gate Service history"})
	return h, nil
}

func (h *History) Run(ctx context.Context) { h.reflector.RunWithContext(ctx) }

func (h *History) Synced() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.isSynced
}

// WaitSynced waits for the first list.
func (h *History) WaitSynced(ctx context.Context) bool {
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

// inViewBefore reports whether the Service key was in the view just before
// resourceVersion at, and its uid then. It waits (briefly) until the history
// has seen everything before at. known is false when the history cannot
// tell: at is older than what it knows exactly, or it did not catch up in
// time.
func (h *History) inViewBefore(key string, at uint64) (in bool, uid string, known bool) {
	if at == 0 {
		return false, "", false
	}
	before := at - 1
	timeout := time.NewTimer(historyWait)
	defer timeout.Stop()
	for {
		h.mu.Lock()
		if h.isSynced && h.horizon >= before {
			if before < h.floor {
				h.mu.Unlock()
				return false, "", false
			}
			for _, p := range h.passages[key] {
				if p.from <= before && (p.to == 0 || before < p.to) {
					h.mu.Unlock()
					return true, p.uid, true
				}
			}
			h.mu.Unlock()
			return false, "", true
		}
		advanced := h.advanced
		h.mu.Unlock()
		select {
		case <-advanced:
		case <-timeout.C:
			return false, "", false
		}
	}
}

// advance moves the horizon; called with h.mu held.
func (h *History) advance(rv uint64) {
	if rv > h.horizon {
		h.horizon = rv
		close(h.advanced)
		h.advanced = make(chan struct{})
	}
}

// record notes one version of a Service (deleted: its deletion); called with
// h.mu held.
func (h *History) record(obj any, deleted bool) {
	s, ok := obj.(*service.HistoryService)
	if !ok {
		return
	}
	f := s.Facts
	rv, _ := parseResourceVersion(f.ResourceVersion)
	h.advance(rv)
	h.note(f.Key(), f.UID, !deleted && h.view.Shows(f), rv)
	h.forget()
}

// note records that the Service key is (in) or is not in the view from rv
// on; called with h.mu held.
func (h *History) note(key, uid string, in bool, rv uint64) {
	ps := h.passages[key]
	open := len(ps) > 0 && ps[len(ps)-1].to == 0
	switch {
	case in && !open:
		h.passages[key] = append(ps, passage{from: rv, uid: uid})
	case in && uid != ps[len(ps)-1].uid:
		// Another Service of that name (a relist found it replaced).
		ps[len(ps)-1].to, ps[len(ps)-1].left = max(rv, ps[len(ps)-1].from+1), time.Now()
		h.passages[key] = append(ps, passage{from: max(rv, ps[len(ps)-1].from+1), uid: uid})
	case in && ps[len(ps)-1].from > rv:
		ps[len(ps)-1].from = rv // a list's item older than the event that opened it
	case !in && open:
		ps[len(ps)-1].to, ps[len(ps)-1].left = max(rv, ps[len(ps)-1].from+1), time.Now()
	}
}

// forget drops passages that ended longer than forgetAfter ago and raises
// the floor past them; called with h.mu held.
func (h *History) forget() {
	now := time.Now()
	if now.Sub(h.lastForget) < time.Minute {
		return
	}
	h.lastForget = now
	cutoff := now.Add(-forgetAfter)
	for key, ps := range h.passages {
		kept := ps[:0]
		for _, p := range ps {
			if p.to != 0 && p.left.Before(cutoff) {
				h.floor = max(h.floor, p.to)
				continue
			}
			kept = append(kept, p)
		}
		if len(kept) == 0 {
			delete(h.passages, key)
		} else {
			h.passages[key] = kept
		}
	}
}

// Add implements cache.Store.
func (h *History) Add(obj any) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.record(obj, false)
	return nil
}

// Update implements cache.Store.
func (h *History) Update(obj any) error { return h.Add(obj) }

// Delete implements cache.Store.
func (h *History) Delete(obj any) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.record(obj, true)
	return nil
}

// Replace implements cache.Store: the first list, or a relist after the watch
// lost events. The history is exact only from the list on: what happened
// in between is unknown.
func (h *History) Replace(items []any, resourceVersion string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	rv, _ := parseResourceVersion(resourceVersion)
	listed := map[string]bool{}
	for _, obj := range items {
		s, ok := obj.(*service.HistoryService)
		if !ok {
			continue
		}
		f := s.Facts
		at, _ := parseResourceVersion(f.ResourceVersion)
		in := h.view.Shows(f)
		listed[f.Key()] = in
		h.note(f.Key(), f.UID, in, at)
	}
	for key, ps := range h.passages {
		if in := listed[key]; !in && ps[len(ps)-1].to == 0 {
			// Gone from the view while the watch was away, at some version
			// before the list.
			h.note(key, "", false, rv)
		}
	}
	h.floor = max(h.floor, rv)
	h.isSynced = true
	close(h.advanced) // wakes waitSynced even when the horizon stays
	h.advanced = make(chan struct{})
	h.advance(rv)
	return nil
}

// UpdateResourceVersion implements cache.ResourceVersionUpdater (bookmarks).
func (h *History) UpdateResourceVersion(resourceVersion string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	rv, _ := parseResourceVersion(resourceVersion)
	h.advance(rv)
}

// Bookmark implements cache.Store. The reflector also hands every bookmark's
// resourceVersion to UpdateResourceVersion, which moves the horizon; nothing
// more to do here.
func (h *History) Bookmark(string) {}

// LastStoreSyncResourceVersion implements cache.Store: the horizon.
func (h *History) LastStoreSyncResourceVersion() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.horizon == 0 {
		return ""
	}
	return strconv.FormatUint(h.horizon, 10)
}

// The reflector never reads the store back.

// List implements cache.Store.
func (h *History) List() []any { return nil }

// ListKeys implements cache.Store.
func (h *History) ListKeys() []string { return nil }

// Get implements cache.Store.
func (h *History) Get(any) (any, bool, error) { return nil, false, nil }

// GetByKey implements cache.Store.
func (h *History) GetByKey(string) (any, bool, error) { return nil, false, nil }

// Resync implements cache.Store.
func (h *History) Resync() error { return nil }

// parseResourceVersion reads a resourceVersion as the API server writes them
// (etcd revisions); ok is false for anything that is not a positive number.
func parseResourceVersion(rv string) (uint64, bool) {
	v, err := strconv.ParseUint(rv, 10, 64)
	return v, err == nil && v > 0
}
