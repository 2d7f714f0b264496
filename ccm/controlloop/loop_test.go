package controlloop_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/controlloop"
)

// calls records the syncs of a loop.
type calls struct {
	mu    sync.Mutex
	names []string
}

func (c *calls) add(name string) {
	c.mu.Lock()
	c.names = append(c.names, name)
	c.mu.Unlock()
}

func (c *calls) of(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, x := range c.names {
		if x == name {
			n++
		}
	}
	return n
}

// waitFor polls cond (no wall-clock assertion: only an upper bound to fail a
// hung test).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("never happened: %s", what)
	}
}

// start runs the loop until the test ends; the returned stop cancels it and
// waits for Run to return.
func start(t *testing.T, l *controlloop.Loop) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	sync := func(context.Context, string) error { return nil }
	tests := []struct {
		name string
		// cfg is what New gets
		cfg controlloop.Config
	}{
		{name: "no name", cfg: controlloop.Config{Workers: 1, Sync: sync}},
		{name: "no workers", cfg: controlloop.Config{Name: "x", Sync: sync}},
		{name: "negative workers", cfg: controlloop.Config{Name: "x", Workers: -1, Sync: sync}},
		{name: "no sync", cfg: controlloop.Config{Name: "x", Workers: 1}},
		{name: "max delay below base", cfg: controlloop.Config{Name: "x", Workers: 1, Sync: sync, BaseDelay: time.Minute, MaxDelay: time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if l, err := controlloop.New(tt.cfg); err == nil || l != nil {
				t.Fatalf("New(%+v) = %v, %v; want an error", tt.cfg, l, err)
			}
		})
	}
}

// What a sync returns decides what happens to the name: success forgets it,
// a failure or ErrRetry brings it back after its back-off, ErrSetAside leaves
// it to whoever set it aside.
func TestSyncOutcomes(t *testing.T) {
	var seen calls
	var setAsideOnce atomic.Bool
	l, err := controlloop.New(controlloop.Config{
		Name: "test", Kind: "thing", Workers: 1, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond,
		Sync: func(_ context.Context, name string) error {
			seen.add(name)
			n := seen.of(name)
			switch name {
			case "fails-twice":
				if n <= 2 {
					return fmt.Errorf("attempt %d: %w", n, errors.New("API server unavailable"))
				}
			case "waits-twice":
				if n <= 2 {
					return fmt.Errorf("no free CIDR: %w", controlloop.ErrRetry)
				}
			case "set-aside":
				if setAsideOnce.CompareAndSwap(false, true) {
					return fmt.Errorf("another worker reads its node: %w", controlloop.ErrSetAside)
				}
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	start(t, l)
	for _, name := range []string{"ok", "fails-twice", "waits-twice", "set-aside"} {
		l.Add(name)
	}
	waitFor(t, "fails-twice synced three times", func() bool { return seen.of("fails-twice") == 3 })
	waitFor(t, "waits-twice synced three times", func() bool { return seen.of("waits-twice") == 3 })
	waitFor(t, "set-aside synced", func() bool { return seen.of("set-aside") == 1 })

	// A marker queued now is synced after every retry that was due: with
	// back-offs of a few milliseconds, a retry of set-aside (or a fourth sync
	// of the others) would have come long before.
	time.Sleep(50 * time.Millisecond)
	l.Add("marker")
	waitFor(t, "marker synced", func() bool { return seen.of("marker") == 1 })
	for name, want := range map[string]int{"ok": 1, "fails-twice": 3, "waits-twice": 3, "set-aside": 1} {
		if got := seen.of(name); got != want {
			t.Errorf("%s synced %d times, want %d", name, got, want)
		}
	}
	// whoever set it aside queues it again
	l.Add("set-aside")
	waitFor(t, "set-aside synced again", func() bool { return seen.of("set-aside") == 2 })
}

// Workers sync different names concurrently; one name is never synced by two
// workers at once, however often it is added meanwhile.
func TestWorkersAndOneSyncPerName(t *testing.T) {
	const workers = 3
	release, releaseSame := make(chan struct{}), make(chan struct{})
	var inFlight, maxInFlight, sameName atomic.Int32
	var seen calls
	l, err := controlloop.New(controlloop.Config{
		Name: "test", Workers: workers,
		Sync: func(_ context.Context, name string) error {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				m := maxInFlight.Load()
				if n <= m || maxInFlight.CompareAndSwap(m, n) {
					break
				}
			}
			if name == "same" {
				if sameName.Add(1) > 1 {
					t.Errorf("%s synced by two workers at once", name)
				}
				defer sameName.Add(-1)
			}
			seen.add(name)
			if name == "same" {
				<-releaseSame
			} else {
				<-release
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	start(t, l)
	for i := range workers + 1 {
		l.Add(fmt.Sprint("node-", i))
	}
	waitFor(t, "all workers busy", func() bool { return inFlight.Load() == workers })
	time.Sleep(20 * time.Millisecond) // a fourth worker would have started by now
	if got := maxInFlight.Load(); got != workers {
		t.Fatalf("%d syncs at once, want %d (the workers)", got, workers)
	}
	close(release)
	waitFor(t, "fourth name synced", func() bool { return seen.of(fmt.Sprint("node-", workers)) == 1 })

	// "same" is added again while it is being synced: a second sync follows
	// the first, never beside it.
	l.Add("same")
	waitFor(t, "same in flight", func() bool { return sameName.Load() == 1 })
	l.Add("same")
	l.Add("same")
	time.Sleep(20 * time.Millisecond)
	close(releaseSame)
	waitFor(t, "same synced twice", func() bool { return seen.of("same") == 2 })
}

// Run returns only once the workers have finished the syncs they were in,
// and nothing is synced after it returned.
func TestRunWaitsForWorkers(t *testing.T) {
	var running, finished atomic.Int32
	l, err := controlloop.New(controlloop.Config{
		Name: "test", Workers: 2,
		Sync: func(ctx context.Context, _ string) error {
			running.Add(1)
			<-ctx.Done()
			// cleaning up after the context ended takes a while
			time.Sleep(50 * time.Millisecond)
			finished.Add(1)
			return ctx.Err()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, l)
	l.Add("a")
	l.Add("b")
	waitFor(t, "both syncs running", func() bool { return running.Load() == 2 })
	stop()
	if got := finished.Load(); got != 2 {
		t.Fatalf("Run returned with %d of 2 syncs unfinished", 2-got)
	}
	l.Add("c")
	time.Sleep(20 * time.Millisecond)
	if got := running.Load(); got != 2 {
		t.Fatalf("%d syncs after Run returned", got-2)
	}
}

// Nothing is synced before the caches have synced and Start has run; when
// Start gives up, Run returns without syncing and its queue is shut down.
func TestRunWaitsForCachesAndStart(t *testing.T) {
	var synced, started atomic.Bool
	var order []string
	var mu sync.Mutex
	note := func(s string) {
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
	}
	l, err := controlloop.New(controlloop.Config{
		Name: "test", Workers: 1,
		Synced: []cache.InformerSynced{synced.Load},
		Start: func(context.Context) bool {
			note("start")
			started.Store(true)
			return true
		},
		Sync: func(_ context.Context, name string) error { note(name); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	l.Add("early") // handlers queue names before Run
	start(t, l)
	time.Sleep(150 * time.Millisecond) // the cache sync poll runs every 100ms
	if started.Load() {
		t.Fatal("Start ran before the caches synced")
	}
	synced.Store(true)
	waitFor(t, "early synced", func() bool { mu.Lock(); defer mu.Unlock(); return slices.Contains(order, "early") })
	mu.Lock()
	if !slices.Equal(order, []string{"start", "early"}) {
		t.Errorf("order %v, want start then early", order)
	}
	mu.Unlock()

	var syncs atomic.Int32
	gaveUp, err := controlloop.New(controlloop.Config{
		Name: "test-gave-up", Workers: 1,
		Start: func(context.Context) bool { return false },
		Sync:  func(context.Context, string) error { syncs.Add(1); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	gaveUp.Add("x")
	done := make(chan struct{})
	go func() { defer close(done); gaveUp.Run(context.Background()) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after Start gave up")
	}
	gaveUp.Add("y")
	if syncs.Load() != 0 {
		t.Fatalf("%d syncs although Start gave up", syncs.Load())
	}
}
