// Package controlloop is the work loop every talos-ccm controller runs
// (cloud-node, node-csr-approval, node-ipam-controller): a rate-limited queue
// of object names that informer handlers feed, a fixed number of workers that
// each take a name and sync it, and a per-name exponential back-off when a
// sync fails. Run returns only once every worker has finished, so no sync
// outlives the controller.
//
// It owns the queue and the workers, nothing else: what a sync does, which
// events are recorded and what is logged about an object are the
// controller's. It never talks to the API server.
package controlloop

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

var (
	// ErrRetry is what a sync's error wraps when nothing failed but the object
	// is not ready yet (a node waiting for a free CIDR, a request waiting for
	// its node): the name is synced again after its back-off, and the loop
	// logs nothing (the controller said why).
	ErrRetry = errors.New("not ready yet")
	// ErrSetAside is what a sync's error wraps when the name is to be neither
	// retried nor forgotten: whoever set it aside queues it again (Add,
	// AddRateLimited) once what it waits for is done.
	ErrSetAside = errors.New("set aside")
)

// Default back-off of a name whose sync failed.
const (
	DefaultBaseDelay = time.Second
	DefaultMaxDelay  = 5 * time.Minute
)

// Config describes one controller's loop.
type Config struct {
	// Name is the controller's name (--controllers): the queue's name in
	// workqueue metrics and the "controller" key of the loop's logs.
	Name string
	// Kind is what a name in the queue names, the key of the loop's log lines
	// about one object ("node", "csr").
	Kind string
	// Workers is the number of names synced concurrently (at least 1). One
	// name is never synced by two workers at once.
	Workers int
	// BaseDelay and MaxDelay bound the per-name exponential back-off after
	// failed syncs (zero: DefaultBaseDelay, DefaultMaxDelay).
	BaseDelay, MaxDelay time.Duration
	// Sync brings the object called name to where it should be. nil forgets
	// the name's back-off; an error wrapping ErrRetry or ErrSetAside is
	// handled as they say; any other error is logged and the name is retried
	// after its back-off.
	Sync func(ctx context.Context, name string) error
	// Synced are the informers whose caches must have synced before the first
	// sync.
	Synced []cache.InformerSynced
	// Start, if set, runs once after the caches have synced and before the
	// workers start; when it returns false Run returns without starting them
	// (the context ended, or the controller cannot work).
	Start func(ctx context.Context) bool
	// FailureVerbosity is 0 to log failed syncs as errors; above 0 they are
	// logged as info at that verbosity, for a controller that records every
	// failure as an event on the object already.
	FailureVerbosity klog.Level
}

// Loop is one controller's queue and workers.
type Loop struct {
	cfg   Config
	queue workqueue.TypedRateLimitingInterface[string]
}

// New returns the loop with an empty queue; informer handlers may Add to it
// before Run.
func New(cfg Config) (*Loop, error) {
	const op = "controlloop.New"
	var errs []error
	if cfg.Name == "" {
		errs = append(errs, errors.New("a name is required"))
	}
	if cfg.Workers < 1 {
		errs = append(errs, fmt.Errorf("workers must be at least 1, got %d", cfg.Workers))
	}
	if cfg.Sync == nil {
		errs = append(errs, errors.New("a sync function is required"))
	}
	if cfg.BaseDelay <= 0 {
		cfg.BaseDelay = DefaultBaseDelay
	}
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = DefaultMaxDelay
	}
	if cfg.MaxDelay < cfg.BaseDelay {
		errs = append(errs, fmt.Errorf("max delay %s is below base delay %s", cfg.MaxDelay, cfg.BaseDelay))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", op, cfg.Name, err)
	}
	if cfg.Kind == "" {
		cfg.Kind = "name"
	}
	return &Loop{
		cfg: cfg,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.BaseDelay, cfg.MaxDelay),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: cfg.Name}),
	}, nil
}

// Add queues name for a sync (once, however often it is added meanwhile).
// After Run has returned it does nothing.
func (l *Loop) Add(name string) { l.queue.Add(name) }

// AddRateLimited queues name after its back-off.
func (l *Loop) AddRateLimited(name string) { l.queue.AddRateLimited(name) }

// Run waits for the caches, runs Start, then syncs with Config.Workers
// workers until ctx is done. It returns once every worker has finished its
// sync; the queue is shut down then, whatever ended Run.
func (l *Loop) Run(ctx context.Context) {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer l.queue.ShutDown()

	if !cache.WaitForNamedCacheSyncWithContext(ctx, l.cfg.Synced...) {
		return
	}
	if l.cfg.Start != nil && !l.cfg.Start(ctx) {
		return
	}
	var wg sync.WaitGroup
	for range l.cfg.Workers {
		wg.Go(func() { wait.UntilWithContext(ctx, l.work, time.Second) })
	}
	<-ctx.Done()
	l.queue.ShutDown()
	wg.Wait()
}

// work syncs names until the queue is shut down.
func (l *Loop) work(ctx context.Context) {
	for l.next(ctx) {
	}
}

func (l *Loop) next(ctx context.Context) bool {
	name, quit := l.queue.Get()
	if quit {
		return false
	}
	defer l.queue.Done(name)
	switch err := l.cfg.Sync(ctx, name); {
	case err == nil:
		l.queue.Forget(name)
	case errors.Is(err, ErrSetAside):
		// queued again by whoever set it aside
	case errors.Is(err, ErrRetry):
		l.queue.AddRateLimited(name)
	case ctx.Err() != nil:
		// shutting down: the sync was cut short, nothing is retried
	default:
		if l.cfg.FailureVerbosity > 0 {
			klog.V(l.cfg.FailureVerbosity).InfoS("Sync failed, will retry", "controller", l.cfg.Name, l.cfg.Kind, klog.KRef("", name), "err", err)
		} else {
			utilruntime.HandleErrorWithContext(ctx, err, "Sync failed, will retry", "controller", l.cfg.Name, l.cfg.Kind, klog.KRef("", name))
		}
		l.queue.AddRateLimited(name)
	}
	return true
}
