package version_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestReleaseBuildVersion builds every binary the way image builds set the
// version (hack/ship's -X on ship.VersionSymbol) and runs each with
// --version: it prints that version and exits 0 at once, with no
// configuration, cluster or Talos API (talos-ccm used to fail on its missing
// talosconfig instead).
func TestReleaseBuildVersion(t *testing.T) {
	const v = "9.8.7"
	dir := t.TempDir()
	// The flags of hack/ship's builds (their compiled packages are shared).
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-tags="+ship.ReleaseTags,
		"-ldflags=-X "+ship.VersionSymbol+"="+v, "-o", dir+string(filepath.Separator),
		"./cmd/talos-ccm", "./cmd/ccm-coordinator", "./cmd/ccm-gate", "./cmd/hybridctl")
	build.Dir = testenv.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, bin := range []string{"talos-ccm", "ccm-coordinator", "ccm-gate", "hybridctl"} {
		cmd := exec.Command(filepath.Join(dir, bin), "--version")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s --version: %v\n%s", bin, err, out)
			continue
		}
		if want := bin + " " + v + " ("; !strings.HasPrefix(string(out), want) || strings.Count(string(out), "\n") != 1 {
			t.Errorf("%s --version printed %q, want one line starting %q", bin, out, want)
		}
	}
}
