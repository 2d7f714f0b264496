package aws

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
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
	// gateBin is the ccm-gate binary.
	gateBin string
)

// TestMain builds what the test runs (that needs the Go module proxy), then
// re-executes the test binary in a network namespace that has only lo, where
// the control plane, the fake AWS APIs, the gate and the CCM run.
func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		// A network namespace. Not a skip: CI and developers run the tests
		// as root.
		fmt.Fprintln(os.Stderr, "test/aws runs in a network namespace and needs root")
		os.Exit(1)
	}
	if !netns.Isolated() {
		// Outside, where the Go module proxy is reachable: build, then
		// netns.Main re-executes the binary in the namespace.
		dir, err := os.MkdirTemp("", "hybrid-ccm-aws-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		code := func() int {
			defer os.RemoveAll(dir)
			if err := build(dir); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			return netns.Main(func() int { return 1 })
		}()
		os.Exit(code)
	}
	os.Exit(netns.Main(func() int {
		if err := netns.AddLoopbackAddress(1, imdsAddr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		awsCCM, gateBin = os.Getenv("HYBRID_CCM_TEST_AWS_CCM"), os.Getenv("HYBRID_CCM_TEST_GATE")
		return testenv.Run(m, testenv.Options{CRDDirectoryPaths: chartstest.CRDDirectoryPaths()}, func(e *testenv.Env) { env = e })
	}))
}

// build builds the AWS CCM (hack/aws-ccm.sh) and the ccm-gate binary into
// dir and passes their paths to the re-executed binary.
func build(dir string) error {
	root := testenv.RepoRoot()
	cmd := exec.Command(filepath.Join(root, "hack", "aws-ccm.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("hack/aws-ccm.sh: %w", err)
	}
	gate, err := gatetest.BuildGate(dir)
	if err != nil {
		return err
	}
	os.Setenv("HYBRID_CCM_TEST_AWS_CCM", strings.TrimSpace(string(out)))
	os.Setenv("HYBRID_CCM_TEST_GATE", gate)
	return nil
}
