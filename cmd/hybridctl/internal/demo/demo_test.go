package demo_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var (
	binDir   string
	buildErr error
	build    sync.Once
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hybrid-ccm-demo-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// binaries builds hybridctl, talos-ccm and ccm-coordinator once into one
// directory (hybridctl finds the others next to itself, as in bin/), and the
// upstream AWS CCM the demo runs into its cache (hack/aws-ccm.sh, as `make
// demo` does; a no-op once built).
func binaries(t *testing.T) string {
	t.Helper()
	build.Do(func() {
		goBuild := exec.Command("go", "build", "-o", binDir, "./cmd/hybridctl", "./cmd/talos-ccm", "./cmd/ccm-coordinator")
		goBuild.Dir = testenv.RepoRoot()
		out, err := goBuild.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build: %v\n%s", err, out)
			return
		}
		cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "aws-ccm.sh"))
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("hack/aws-ccm.sh: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// TestDemoReachesEndState runs the demo non-interactively, as `make demo` does
// without a terminal, and checks its end state (the demo itself fails unless
// it is exactly as expected): every node initialized, every honest CSR
// approved, the forged one denied, every native CCM running in a pod that
// holds its lease, gated; after the outage the gone hcloud server's node
// deleted by the hcloud CCM, the terminated aws instance's node deleted and
// the stopped one's tainted by the upstream AWS CCM, the powered-off metal
// node and the other hcloud node untouched, and no cloud asked about
// another's node (the fake EC2's call log: only the two aws instances).
func TestDemoReachesEndState(t *testing.T) {
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := binaries(t)
	// the real command, as `make demo` runs it without a terminal: in a
	// network namespace of its own, exit status 0 only if the end state is
	// exactly as expected
	cmd := exec.Command(filepath.Join(bin, "hybridctl"), "demo", "--timeout=5m")
	cmd.Env = append(os.Environ(), "KUBEBUILDER_ASSETS="+assets)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("hybridctl demo: %v\n%s", err, out.String())
	}
	t.Logf("demo output:\n%s", out.String())
	for _, want := range []string{
		"node/hcloud-app-1", "providerID=hcloud://5101",
		"node/web-metal1", "providerID=talos://metal/192.168.10.11",
		"csr/forged-by-aws-web-1", "Denied",
		"nativeccm/hcloud", "running: release native-ccm-hcloud rev 1, lease held by pod native-ccm-hcloud-",
		"gate/delete node/aws-web-1", "denied: ", "hybrid-ccm gate",
		"gate/delete node/hcloud-app-1 (dry run)", "allowed",
		"the aws CCM is the upstream one: ", "aws-cloud-controller-manager",
		"nativeccm/aws", "running: release native-ccm-aws rev 1, lease held by pod native-ccm-aws-",
		"cloud/hcloud/hcloud-app-2", "cloud/aws/aws-web-1", "cloud/aws/aws-web-2",
		"podCIDRs=10.244.", "NotReady (kubelet silent), tainted shutdown",
		"8/8 nodes initialized, 8/8 CSRs approved, 1 denied, 3/3 native CCMs installed, running and gated; " +
			"outage: hcloud-app-2 deleted by the hcloud CCM, aws-web-1 deleted and aws-web-2 tainted shutdown by the aws CCM, db-metal1 left alone",
		"demo finished; everything it started is stopped and its temporary files are removed",
		"service/shop/web-aws", "from the aws cloud's load balancer, targets aws-web-2",
		"service/shop/web-hcloud", "from the hcloud cloud's load balancer, targets hcloud-app-1",
		"4/4 LoadBalancer Services have an address from their cloud",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if !regexp.MustCompile(`(?m)node/hcloud-app-2 +deleted`).MatchString(out.String()) {
		t.Errorf("demo output does not show node hcloud-app-2 deleted:\n%s", out.String())
	}
	// the upstream AWS CCM deleted its terminated instance's node (its event)
	if !regexp.MustCompile(`(?m)node/aws-web-1 +deleted — aws-cloud-controller-manager `).MatchString(out.String()) {
		t.Errorf("demo output does not show node aws-web-1 deleted by the AWS CCM:\n%s", out.String())
	}
	// no other node was deleted: the NotReady metal node and hcloud-app-1 stay
	for _, m := range regexp.MustCompile(`(?m)node/(\S+) +deleted`).FindAllStringSubmatch(out.String(), -1) {
		if m[1] != "hcloud-app-2" && m[1] != "aws-web-1" {
			t.Errorf("node %s was deleted", m[1])
		}
	}
	// the fake clouds were asked about exactly these nodes, each by its own
	// cloud; the fake EC2 only about the two aws instances, by ID
	for _, m := range regexp.MustCompile(`\] cloud/(\S+)`).FindAllStringSubmatch(out.String(), -1) {
		if m[1] != "hcloud/hcloud-app-2" && m[1] != "aws/aws-web-1" && m[1] != "aws/aws-web-2" {
			t.Errorf("cloud/%s: a cloud was asked about a node that is not its own or not down", m[1])
		}
	}
}
