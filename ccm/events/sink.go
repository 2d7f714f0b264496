// Package events holds the event sink talos-ccm's controllers record through.
package events

import (
	"context"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// AsyncSink writes new events with several workers. client-go's broadcaster
// hands events to its sink one at a time and drops what does not fit in a
// queue of 1000 while it waits: one API round trip per event caps a burst
// (1000 CSR decisions a second, each with an event on the CSR and one on the
// Node) at what one connection writes serially, and the rest is lost. Create
// here only queues (bounded: beyond queue, events are dropped and counted in
// the log, as the broadcaster would, and in talos_ccm_events_dropped_total) and answers with the event as it will be
// created; the broadcaster's name for it is final, so a later aggregation
// patch finds it, and one that comes before the create makes the broadcaster
// create it (its fallback on NotFound). Updates and patches are rare and stay
// synchronous.
type AsyncSink struct {
	sink  record.EventSink
	queue chan *corev1.Event

	dropped atomic.Int64
}

// NewAsyncSink starts workers writers of sink until ctx ends, with room for
// queue events waiting.
func NewAsyncSink(ctx context.Context, sink record.EventSink, workers, queue int) *AsyncSink {
	register()
	s := &AsyncSink{sink: sink, queue: make(chan *corev1.Event, queue)}
	for range workers {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case ev := <-s.queue:
					s.create(ctx, ev)
				}
			}
		}()
	}
	return s
}

// create writes one event, retrying transient failures a few times.
func (s *AsyncSink) create(ctx context.Context, ev *corev1.Event) {
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: 4}
	var err error
	_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(context.Context) (bool, error) {
		_, err = s.sink.Create(ev)
		if apierrors.IsAlreadyExists(err) {
			err = nil // written by an earlier attempt whose answer was lost
		}
		return err == nil || !retriable(err), nil
	})
	if err != nil && ctx.Err() == nil {
		// as client-go's broadcaster reports an event the server rejected
		klog.ErrorS(err, "Event not recorded", "object", klog.KRef(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name), "kind", ev.InvolvedObject.Kind, "reason", ev.Reason)
	}
}

// Create queues the event and returns it as it will be created.
func (s *AsyncSink) Create(ev *corev1.Event) (*corev1.Event, error) {
	select {
	case s.queue <- ev.DeepCopy():
	default:
		droppedEvents.Inc()
		// said once, then every 1000th, so a flood does not flood the log too
		if n := s.dropped.Add(1); n == 1 || n%1000 == 0 {
			klog.InfoS("Event queue full, events dropped", "queue", cap(s.queue), "droppedSoFar", n,
				"object", klog.KRef(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name), "reason", ev.Reason)
		}
	}
	return ev, nil
}

// Update writes at once.
func (s *AsyncSink) Update(ev *corev1.Event) (*corev1.Event, error) { return s.sink.Update(ev) }

// Patch writes at once.
func (s *AsyncSink) Patch(ev *corev1.Event, data []byte) (*corev1.Event, error) {
	return s.sink.Patch(ev, data)
}

// retriable: failures that another attempt may not repeat (timeouts, 429,
// 5xx, connection errors).
func retriable(err error) bool {
	return !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) &&
		!apierrors.IsNotFound(err) && !apierrors.IsBadRequest(err) && !apierrors.IsUnauthorized(err)
}

// Defaults for talos-ccm's recorders: writers, and events that may wait.
const (
	Workers = 2
	Queue   = 10000
)
