package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/discovery"
)

// countingDiscovery answers /version as the API server at env does, and
// counts the calls; err, when set, is answered instead.
type countingDiscovery struct {
	real  *discovery.DiscoveryClient
	calls int
	err   error
}

func (c *countingDiscovery) ServerVersion() (*version.Info, error) {
	c.calls++
	if c.err != nil {
		return nil, c.err
	}
	return c.real.ServerVersion()
}

// TestCachedServerVersion: the API server's version is asked once per TTL,
// not per reconcile; after the TTL it is asked again (an upgrade is seen); a
// failure is an error naming what failed, and the next call asks again.
func TestCachedServerVersion(t *testing.T) {
	d := &countingDiscovery{real: discovery.NewDiscoveryClientForConfigOrDie(env.Config)}
	now := time.Unix(1000, 0)
	c := &CachedServerVersion{Discovery: d, TTL: time.Minute, now: func() time.Time { return now }}
	wantGit, wantMinor := apiServer(t)
	for i := range 3 {
		git, minor, err := c.ServerVersion(context.Background())
		if err != nil || git != wantGit || minor != wantMinor {
			t.Fatalf("call %d: %q %d %v, want %q %d", i, git, minor, err, wantGit, wantMinor)
		}
	}
	if d.calls != 1 {
		t.Errorf("%d discovery calls within the TTL, want 1", d.calls)
	}
	now = now.Add(time.Minute)
	d.err = errors.New("connection refused")
	if _, _, err := c.ServerVersion(context.Background()); err == nil || err.Error() != "read the API server's version: connection refused" {
		t.Errorf("after the TTL with discovery failing: %v", err)
	}
	d.err = nil
	if git, _, err := c.ServerVersion(context.Background()); err != nil || git != wantGit || d.calls != 3 {
		t.Errorf("after a failure: %q %v, %d calls (want 3)", git, err, d.calls)
	}
}
