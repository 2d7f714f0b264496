package install

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
	"github.com/hybrid-ccm/hybrid-ccm/test/podrunner"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var (
	env *testenv.Env
	// layout is the OCI image layout of the repository's images, built for
	// this machine's platform as `make images` builds them.
	layout string
	// testCCM is test/testccm, the stand-in for upstream CCM images.
	testCCM string
)

func TestMain(m *testing.M) {
	// The pods listen on the ports the charts render: a network namespace of
	// the package's own keeps them off the host's ports (and other packages'
	// pods), and keeps everything on loopback.
	os.Exit(netns.Main(func() int { return run(m) }))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		// The pod runner needs mount namespaces, chroot and setuid. This is
		// not a skip: CI and developers run the tests as root.
		fmt.Fprintln(os.Stderr, "test/install runs pods and needs root")
		return 1
	}
	dir, err := os.MkdirTemp("", "hybrid-ccm-install-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return func() int {
		defer os.RemoveAll(dir)
		layout = filepath.Join(dir, "images")
		if _, err := ship.Build(context.Background(), ship.Options{Platforms: []string{ship.HostPlatform()}, Out: layout}); err != nil {
			fmt.Fprintf(os.Stderr, "build images: %v\n", err)
			return 1
		}
		testCCM = filepath.Join(dir, "testccm")
		build := exec.Command("go", "build", "-trimpath", "-o", testCCM, filepath.Join(testenv.RepoRoot(), "test", "testccm"))
		build.Env = append(os.Environ(), "CGO_ENABLED=0") // runs in an empty root
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build test/testccm: %v\n%s", err, out)
			return 1
		}
		return testenv.Run(m, testenv.Options{CRDDirectoryPaths: chartstest.CRDDirectoryPaths()}, func(e *testenv.Env) { env = e })
	}()
}

// images resolves the charts' and the coordinator's image references: the
// repository's own from the layout, every built-in profile's upstream CCM
// image to test/testccm.
func images(t *testing.T, upstream []string) *podrunner.Images {
	t.Helper()
	im, err := podrunner.LayoutImages(layout)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range upstream {
		im.Map(ref, testCCM)
	}
	return im
}
