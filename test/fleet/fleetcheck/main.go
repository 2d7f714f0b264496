package fleetcheck

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// Package describes the fleet a test package runs on.
type Package struct {
	// Name is the package's (test/<Name>), for messages and temporary
	// directories.
	Name string
	// Options of the fleet; Images and Log are filled in.
	Options fleet.Options
	// Platforms whose upstream CCM images the registry serves
	// (fleet.UpstreamImages): the real AWS CCM for aws, test/testccm for
	// the others.
	Platforms []string
	// Images, when set, may add to the images before the fleet starts
	// (upstream reference → binary; awsCCM is the AWS CCM's binary).
	Images func(ctx context.Context, root string, images map[string]string, awsCCM string) error
	// Setup, when set, runs once the fleet is up and set, before the tests
	// (e.g. a release into its registry); After, once they ran.
	Setup func(ctx context.Context, f *fleet.Fleet) error
	After func()
	// OnHost, when set, runs first, in the host's network namespace, where
	// the Go module proxy is in reach (the package's own namespace has no
	// route out): what the tests will need from it is fetched there.
	OnHost func(ctx context.Context, root string) error
}

// Main is a TestMain for a package that runs on a fleet: after p.OnHost,
// in a network namespace of the package's own (nothing the cluster runs can reach
// beyond it), as root, it builds or reuses the upstream CCM images, brings
// the fleet up, hands it to set, runs the tests, prints the cluster's log
// tails when one failed and takes everything down.
func Main(m *testing.M, p Package, set func(*fleet.Fleet)) {
	if p.OnHost != nil && !netns.Isolated() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		err := p.OnHost(ctx, testenv.RepoRoot())
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "test/%s, on the host: %v\n", p.Name, err)
			os.Exit(1)
		}
	}
	os.Exit(netns.Main(func() int { return run(m, p, set) }))
}

func run(m *testing.M, p Package, set func(*fleet.Fleet)) int {
	if os.Geteuid() != 0 {
		fmt.Fprintf(os.Stderr, "test/%s runs a cluster and needs root\n", p.Name)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	root := testenv.RepoRoot()
	awsCCM, err := fleet.AWSCCM(ctx, root)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "hybrid-ccm-"+p.Name+"-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	images, err := fleet.UpstreamImages(ctx, root, dir, awsCCM, p.Platforms...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if p.Images != nil {
		if err := p.Images(ctx, root, images, awsCCM); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	opts := p.Options
	opts.Images, opts.Log = images, TimedLog{}
	f, err := fleet.Up(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := f.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "down:", err)
		}
	}()
	set(f)
	if p.Setup != nil {
		if err := p.Setup(ctx, f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	code := m.Run()
	if p.After != nil {
		p.After()
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "cluster logs (tails):\n%s\n", f.Logs(3000))
	}
	return code
}

// TimedLog writes the fleet's steps to standard error with the time.
type TimedLog struct{}

func (TimedLog) Write(p []byte) (int, error) {
	fmt.Fprintf(os.Stderr, "%s %s", time.Now().Format("15:04:05.000"), p)
	return len(p), nil
}
