package demo_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/demo"
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
// directory (hybridctl finds the others next to itself, as in bin/).
func binaries(t *testing.T) string {
	t.Helper()
	build.Do(func() {
		out, err := exec.Command("go", "build", "-o", binDir,
			"../../cmd/hybridctl", "../../cmd/talos-ccm", "../../cmd/ccm-coordinator").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// TestDemoReachesEndState runs the demo non-interactively, as `make demo` does
// on a terminal, and checks its end state: every node initialized, every honest
// CSR approved, the forged one denied.
func TestDemoReachesEndState(t *testing.T) {
	bin := binaries(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := demo.Run(ctx, demo.Options{Out: &out, BinDir: bin, ExitWhenDone: true, Timeout: 3 * time.Minute})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"node/hcloud-app-1", "providerID=hcloud://5101",
		"node/web-metal1", "providerID=talos://metal/192.168.10.11",
		"csr/forged-by-aws-web-1", "Denied",
		"nativeccm/hcloud", "installed: release native-ccm-hcloud",
		"gate/delete node/aws-web-1", "denied: ", "hybrid-ccm gate",
		"gate/delete node/hcloud-app-2 (dry run)", "allowed",
		"8/8 nodes initialized, 8/8 CSRs approved, 1 denied, 3/3 native CCMs installed",
		"demo finished; everything it started is stopped and its temporary files are removed",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
