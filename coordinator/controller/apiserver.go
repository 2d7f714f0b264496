package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/version"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// ServerVersion tells the API server's version: its gitVersion and its
// Kubernetes minor (N of 1.N).
type ServerVersion interface {
	ServerVersion(ctx context.Context) (gitVersion string, minor int, err error)
}

// versionDiscovery is discovery's /version (discovery.DiscoveryClient).
type versionDiscovery interface {
	ServerVersion() (*version.Info, error)
}

// CachedServerVersion asks discovery for the API server's version at most
// once per TTL, not per reconcile: an API server upgrade is seen within the
// TTL (and the NativeCCMs follow it at their next reconcile).
type CachedServerVersion struct {
	Discovery versionDiscovery
	TTL       time.Duration

	mu      sync.Mutex
	fetched time.Time
	git     string
	minor   int
	now     func() time.Time
}

// ServerVersion implements ServerVersion.
func (c *CachedServerVersion) ServerVersion(context.Context) (string, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now
	if c.now != nil {
		now = c.now
	}
	if c.git != "" && now().Sub(c.fetched) < c.TTL {
		return c.git, c.minor, nil
	}
	info, err := c.Discovery.ServerVersion()
	if err != nil {
		return "", 0, fmt.Errorf("read the API server's version: %w", err)
	}
	minor, err := profile.ServerMinor(info.GitVersion)
	if err != nil {
		return "", 0, err
	}
	c.git, c.minor, c.fetched = info.GitVersion, minor, now()
	return c.git, c.minor, nil
}
