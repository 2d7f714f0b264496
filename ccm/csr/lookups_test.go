package csr

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
)

// The lookups of one node: one in flight, every request set aside meanwhile
// gets its outcome once, a failure opens the node's back-off (doubling, capped),
// an answer or a final refusal closes it.
func TestLookups(t *testing.T) {
	var l lookups
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	step := func(node, csr string, now time.Time) lookupStep {
		s, _, _, _ := l.next(node, csr, now)
		return s
	}
	if got := step("n1", "a", t0); got != stepStart {
		t.Fatalf("first request: step %d, want start", got)
	}
	for _, csr := range []string{"b", "a", "b"} {
		if got := step("n1", csr, t0); got != stepWait {
			t.Fatalf("request %s while the lookup runs: step %d, want wait", csr, got)
		}
	}
	if got := step("n2", "c", t0); got != stepStart {
		t.Fatalf("another node's request: step %d, want start (nodes do not wait for each other)", got)
	}
	hang := fmt.Errorf("node n1: %w: deadline exceeded", facts.ErrTalosAPI)
	parked := l.finish("n1", nil, hang, t0)
	if !slices.Equal(parked, []string{"a", "b"}) {
		t.Fatalf("set aside %v, want [a b] once each", parked)
	}
	for _, csr := range parked {
		s, res, _, _ := l.next("n1", csr, t0)
		if s != stepDecide || !errors.Is(res.err, facts.ErrTalosAPI) {
			t.Fatalf("request %s after the lookup: step %d err %v, want the outcome", csr, s, res.err)
		}
	}
	// the outcome is handed once
	s, _, last, retryAt := l.next("n1", "a", t0.Add(500*time.Millisecond))
	if s != stepBackOff || !errors.Is(last, facts.ErrTalosAPI) || !retryAt.Equal(t0.Add(lookupBaseDelay)) {
		t.Fatalf("within the back-off: step %d last %v retry at %s", s, last, retryAt)
	}
	// back-off doubles with each failure in a row
	now := t0
	for i, want := range []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second} {
		now = now.Add(lookupMaxDelay)
		if got := step("n1", "a", now); got != stepStart {
			t.Fatalf("after the back-off (%d): step %d, want start", i, got)
		}
		l.finish("n1", nil, hang, now)
		l.next("n1", "a", now) // takes the outcome
		if _, _, _, at := l.next("n1", "a", now); !at.Equal(now.Add(want)) {
			t.Fatalf("failure %d: next lookup at +%s, want +%s", i+2, at.Sub(now), want)
		}
	}
	if got := backOff(100); got != lookupMaxDelay {
		t.Errorf("back-off after 100 failures %s, want the cap %s", got, lookupMaxDelay)
	}
	// an answer closes it
	now = now.Add(lookupMaxDelay)
	step("n1", "a", now)
	l.finish("n1", &facts.Facts{}, nil, now)
	l.next("n1", "a", now)
	if got := step("n1", "a", now); got != stepStart {
		t.Errorf("after an answer: step %d, want start (no back-off)", got)
	}
	// so does a refusal that waiting does not change
	l.finish("n1", nil, fmt.Errorf("x: %w", facts.ErrIdentity), now)
	l.next("n1", "a", now)
	if got := step("n1", "a", now); got != stepStart {
		t.Errorf("after an identity mismatch: step %d, want start", got)
	}
	// an outcome waiting for a request of another node by the same name is
	// not used
	l.finish("n1", &facts.Facts{}, nil, now)
	if got := step("n3", "a", now); got != stepStart {
		t.Errorf("request a, now of node n3: step %d, want a lookup of n3", got)
	}
	// a deleted node's back-off and a gone request's outcome are forgotten
	l.finish("n2", nil, hang, now)
	l.dropRequest("c")
	l.dropNode("n2")
	if got := step("n2", "c", now); got != stepStart {
		t.Errorf("after the node was deleted: step %d, want start", got)
	}
	// deleted while its lookup runs: forgotten when it ends, failed or not
	l.dropNode("n2")
	l.finish("n2", nil, hang, now)
	if _, known := l.nodes["n2"]; known {
		t.Errorf("a node deleted during its lookup is still remembered after it failed")
	}
}

// talos-ccm's facts source offers what it remembers, so a request of a node
// whose facts are remembered is decided without a lookup.
var _ RememberedFacts = (*facts.Source)(nil)
