package initpages_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

const (
	early     = "github.com/hybrid-ccm/hybrid-ccm/cmd/talos-ccm/internal/initpages/early"
	initpages = "github.com/hybrid-ccm/hybrid-ccm/cmd/talos-ccm/internal/initpages"
	metav1    = "k8s.io/apimachinery/pkg/apis/meta/v1"
	scheme    = "k8s.io/client-go/kubernetes/scheme"
	framework = "k8s.io/cloud-provider/app"
)

// TestReleasePointsSplitInitialization builds talos-ccm as its image does and
// reads the order in which the Go runtime initializes its packages
// (GODEBUG=inittrace=1 lists every package whose initialization does
// something): the two packages that give back the executable's pages must
// fall inside it, each after what it follows and well before its end, or the
// pages they are meant to give back would stay mapped until main.
func TestReleasePointsSplitInitialization(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "talos-ccm")
	build := ship.HostBuild(t.Context(), filepath.Join("..", "..", "..", ".."), bin, "./cmd/talos-ccm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build talos-ccm: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--version")
	cmd.Env = append(cmd.Environ(), "GODEBUG=inittrace=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("talos-ccm --version: %v\n%s", err, stderr.String())
	}
	if !strings.HasPrefix(stdout.String(), "talos-ccm ") {
		t.Errorf("talos-ccm --version printed %q", stdout.String())
	}
	var order []string
	for line := range strings.Lines(stderr.String()) {
		if f := strings.Fields(line); len(f) > 2 && f[0] == "init" && strings.HasPrefix(f[2], "@") {
			order = append(order, f[1])
		}
	}
	at := func(pkg string) int {
		t.Helper()
		i := slices.Index(order, pkg)
		if i < 0 {
			t.Fatalf("%s is not among the %d packages initialized", pkg, len(order))
		}
		return i
	}
	n := len(order)
	e, p := at(early), at(initpages)
	t.Logf("%d packages initialized: %s at %d, %s at %d, %s at %d", n, early, e, initpages, p, framework, at(framework))
	if e < at(metav1) || p < at(scheme) || p < e {
		t.Errorf("a release point runs before what it follows: %s %d, %s %d; %s %d, %s %d", metav1, at(metav1), early, e, scheme, at(scheme), initpages, p)
	}
	// each point has a fifth of the packages before it, and the last a
	// tenth of them after it
	if e < n/5 || p-e < n/5 || n-p < n/10 || p > at(framework) {
		t.Errorf("the release points do not split initialization: %s at %d, %s at %d of %d (%s at %d)", early, e, initpages, p, n, framework, at(framework))
	}
}
