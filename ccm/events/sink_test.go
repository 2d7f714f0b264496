package events

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/component-base/metrics/testutil"
)

// slowSink is an API server that takes a while per event and can fail.
type slowSink struct {
	mu      sync.Mutex
	delay   time.Duration
	fail    map[string]error // event name -> error for its first attempt
	tries   map[string]int
	created map[string]bool
	release chan struct{} // when set, Create waits for it
	entered chan struct{} // when set, Create says it was called
}

func newSlowSink(delay time.Duration) *slowSink {
	return &slowSink{delay: delay, fail: map[string]error{}, tries: map[string]int{}, created: map[string]bool{}}
}

func (s *slowSink) Create(ev *corev1.Event) (*corev1.Event, error) {
	if s.entered != nil {
		s.entered <- struct{}{}
	}
	if s.release != nil {
		<-s.release
	}
	time.Sleep(s.delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tries[ev.Name]++
	if err, ok := s.fail[ev.Name]; ok && s.tries[ev.Name] == 1 {
		return nil, err
	}
	s.created[ev.Name] = true
	return ev, nil
}
func (s *slowSink) Update(ev *corev1.Event) (*corev1.Event, error) { return ev, nil }
func (s *slowSink) Patch(ev *corev1.Event, _ []byte) (*corev1.Event, error) {
	return ev, nil
}

func (s *slowSink) count() (int, map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tries := map[string]int{}
	for k, v := range s.tries {
		tries[k] = v
	}
	return len(s.created), tries
}

func event(i int) *corev1.Event {
	return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("csr-%d.%x", i, i), Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "CertificateSigningRequest", Name: fmt.Sprintf("csr-%d", i)}, Reason: "Approved"}
}

func waitCreated(t *testing.T, s *slowSink, want int) map[string]int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, tries := s.count()
		if n == want {
			return tries
		}
		if n > want || time.Now().After(deadline) {
			t.Fatalf("created %d events, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A burst of 3000 events against a sink that takes 1 ms each: Create never
// waits for the API, and every event is written (the broadcaster alone would
// have dropped what did not fit in its queue of 1000).
func TestAsyncSinkBurst(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newSlowSink(time.Millisecond)
	a := NewAsyncSink(ctx, s, 2, 10000)
	start := time.Now()
	for i := range 3000 {
		ev := event(i)
		got, err := a.Create(ev)
		if err != nil || got.Name != ev.Name {
			t.Fatalf("Create = %v, %v", got, err)
		}
	}
	t.Logf("3000 Creates returned in %s", time.Since(start))
	waitCreated(t, s, 3000)
}

// Transient failures are retried; an event that exists, or one the API
// refuses, is not.
func TestAsyncSinkRetries(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newSlowSink(0)
	gr := schema.GroupResource{Resource: "events"}
	s.fail[event(1).Name] = apierrors.NewServiceUnavailable("etcd leader change")
	s.fail[event(2).Name] = errors.New("connection reset by peer")
	s.fail[event(3).Name] = apierrors.NewAlreadyExists(gr, event(3).Name)
	s.fail[event(4).Name] = apierrors.NewForbidden(gr, event(4).Name, errors.New("namespace terminating"))
	a := NewAsyncSink(ctx, s, 1, 10)
	for i := 1; i <= 4; i++ {
		_, _ = a.Create(event(i))
	}
	tries := waitCreated(t, s, 2)
	time.Sleep(300 * time.Millisecond) // no late retry of 3 and 4
	_, tries = s.count()
	for i, want := range map[int]int{1: 2, 2: 2, 3: 1, 4: 1} {
		if tries[event(i).Name] != want {
			t.Errorf("event %d: %d attempts, want %d", i, tries[event(i).Name], want)
		}
	}
}

// Beyond its queue the sink drops (memory stays bounded) and never blocks.
func TestAsyncSinkBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newSlowSink(0)
	s.release = make(chan struct{})
	s.entered = make(chan struct{}, 100)
	a := NewAsyncSink(ctx, s, 1, 5)
	droppedBefore, err := testutil.GetCounterMetricValue(droppedEvents)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = a.Create(event(0))
	<-s.entered // the worker holds event 0
	done := make(chan struct{})
	go func() {
		for i := 1; i < 20; i++ {
			_, _ = a.Create(event(i))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Create blocked on a full queue")
	}
	close(s.release)
	// one in the worker's hands, five queued; the rest dropped
	waitCreated(t, s, 6)
	time.Sleep(100 * time.Millisecond)
	if n, _ := s.count(); n != 6 {
		t.Errorf("created %d, want 6", n)
	}
	if v, err := testutil.GetCounterMetricValue(droppedEvents); err != nil || v-droppedBefore != 14 {
		t.Errorf("talos_ccm_events_dropped_total grew by %v (%v), want 14", v-droppedBefore, err)
	}
}
