package demo_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/demo"
)

// TestDemoReachesEndState runs the demo non-interactively, as `make demo` does
// on a terminal, and checks its end state: every node initialized, every honest
// CSR approved, the forged one denied.
func TestDemoReachesEndState(t *testing.T) {
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/talos-ccm", "../../cmd/ccm-coordinator").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
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
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
