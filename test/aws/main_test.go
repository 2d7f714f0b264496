package aws

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// imdsAddr is the EC2 instance metadata service's address; the test puts it
// on lo so that a metadata request is answered (and recorded) by the fake
// instead of failing unseen.
var imdsAddr = netip.MustParseAddr("169.254.169.254")

var (
	env *testenv.Env
	// awsCCM is the upstream AWS CCM binary (hack/aws-ccm.sh).
	awsCCM string
	// layout is the OCI image layout of ccm-coordinator and ccm-gate.
	layout string
)

// TestMain builds what the test runs (that needs the Go module proxy), then
// re-executes the test binary in a network namespace that has only lo, where
// the control plane, the fake AWS APIs and every pod run.
func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		// Network and mount namespaces, chroot and setuid. Not a skip: CI and
		// developers run the tests as root.
		fmt.Fprintln(os.Stderr, "test/aws runs pods in a network namespace and needs root")
		os.Exit(1)
	}
	if !netns.Inside() {
		os.Exit(outside())
	}
	if err := netns.Setup(imdsAddr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	awsCCM, layout = os.Getenv("HYBRID_CCM_TEST_AWS_CCM"), os.Getenv("HYBRID_CCM_TEST_LAYOUT")
	os.Exit(testenv.Run(m, testenv.Options{CRDDirectoryPaths: chartstest.CRDDirectoryPaths(),
		// no default route here: the API server advertises loopback
		APIServerFlags: map[string]string{"advertise-address": "127.0.0.1"}}, func(e *testenv.Env) { env = e }))
}

func outside() int {
	root := testenv.RepoRoot()
	out, err := exec.Command(filepath.Join(root, "hack", "aws-ccm.sh")).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			os.Stderr.Write(ee.Stderr)
		}
		fmt.Fprintf(os.Stderr, "hack/aws-ccm.sh: %v\n", err)
		return 1
	}
	bin := strings.TrimSpace(string(out))
	dir, err := os.MkdirTemp("", "hybrid-ccm-aws-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	images := filepath.Join(dir, "images")
	if _, err := ship.Build(context.Background(), ship.Options{Platforms: []string{ship.HostPlatform()},
		Images: []string{"ccm-coordinator", "ccm-gate"}, Out: images}); err != nil {
		fmt.Fprintf(os.Stderr, "build images: %v\n", err)
		return 1
	}
	code, err := netns.Reexec("HYBRID_CCM_TEST_AWS_CCM="+bin, "HYBRID_CCM_TEST_LAYOUT="+images)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return code
}
