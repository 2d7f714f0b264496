package version_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/cmd/internal/version"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestReleaseBuildVersion runs every binary built the way image builds set
// the version (hack/ship's -X on ship.VersionSymbol) with --version: it
// prints that version and exits 0 at once, with no configuration, cluster or
// Talos API (talos-ccm used to fail on its missing talosconfig instead).
func TestReleaseBuildVersion(t *testing.T) {
	bins, v := releaseBinaries(t)
	for _, bin := range ship.Images {
		cmd := exec.Command(bins[bin], "--version")
		cmd.Dir = t.TempDir()
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

// releaseBinaries returns every image's binary and the version it was built
// with: the run's, taken out of its images (test/testbin: the repository's
// version), or, without one, built here with the flags of hack/ship's builds
// (their compiled packages are shared) at 9.8.7. Either version is none a
// build without -X reports.
func releaseBinaries(t *testing.T) (map[string]string, string) {
	bins := map[string]string{}
	if _, ok, _ := testbin.Release(ship.Images[0]); ok {
		v, err := ship.DefaultVersion(testenv.RepoRoot())
		if err != nil {
			t.Fatal(err)
		}
		if v == version.Version {
			t.Fatalf("the repository's version %q is what a build without -X reports", v)
		}
		for _, bin := range ship.Images {
			p, _, err := testbin.Release(bin)
			if err != nil {
				t.Fatal(err)
			}
			bins[bin] = p
		}
		return bins, v
	}
	const v = "9.8.7"
	dir := t.TempDir()
	args := []string{"build", "-trimpath", "-buildvcs=false", "-tags=" + ship.ReleaseTags,
		"-ldflags=-X " + ship.VersionSymbol + "=" + v, "-o", dir + string(filepath.Separator)}
	for _, bin := range ship.Images {
		args = append(args, "./cmd/"+bin)
		bins[bin] = filepath.Join(dir, bin)
	}
	build := exec.Command("go", args...)
	build.Dir = testenv.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bins, v
}
