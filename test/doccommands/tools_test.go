package doccommands

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cacheRoot is where built CLIs are kept across runs, as hack/control-plane.sh
// keeps the control plane: ${HYBRID_CCM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm}.
func cacheRoot() (string, error) {
	if d := os.Getenv("HYBRID_CCM_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "hybrid-ccm"), nil
}

// tools returns a directory holding the CLIs the docs' commands name: helm
// (this module's, built once per version into the cache), kubectl (the
// control plane's version, hack/kubectl.sh), hybridctl (built from this
// checkout), cosign (hack/cosign.sh) and skopeo (Debian's,
// hack/cluster-packages.sh).
func tools(t *testing.T, repo string) string {
	t.Helper()
	dir := t.TempDir()
	link := func(name, path string) {
		t.Helper()
		if err := os.Symlink(path, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	link("helm", helmBinary(t, repo))
	link("kubectl", kubectlBinary(t, repo))

	start := time.Now()
	hybridctl := filepath.Join(t.TempDir(), "hybridctl")
	goCmd(t, repo, "build", "-o", hybridctl, "./cmd/hybridctl")
	t.Logf("built hybridctl in %s", time.Since(start).Round(time.Second))
	link("hybridctl", hybridctl)

	if cosign := cosignBinary(t, repo); cosign != "" {
		link("cosign", cosign)
	}

	skopeo, err := exec.LookPath("skopeo")
	if err != nil {
		t.Fatalf("skopeo (docs/install.md copies an image with it) is not installed: run hack/cluster-packages.sh as root (make test does), or apt-get install skopeo")
	}
	link("skopeo", skopeo)
	return dir
}

// helmBinary builds helm.sh/helm/v3/cmd/helm at the version go.mod selects
// (a tool of the module) into the cache, once per version.
func helmBinary(t *testing.T, repo string) string {
	t.Helper()
	version := strings.TrimSpace(goCmd(t, repo, "list", "-m", "-f", "{{.Version}}", "helm.sh/helm/v3"))
	root, err := cacheRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "helm-"+version, "helm")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	start := time.Now()
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := fmt.Sprintf("%s.tmp.%d", bin, os.Getpid())
	defer os.Remove(tmp)
	// Helm reports its version from this variable; `helm version` says
	// v3.x otherwise, and the test would not know which Helm it ran.
	goCmd(t, repo, "build", "-ldflags=-s -w -X helm.sh/helm/v3/internal/version.version="+version,
		"-o", tmp, "helm.sh/helm/v3/cmd/helm")
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("built helm %s into %s in %s", version, bin, time.Since(start).Round(time.Second))
	return bin
}

// kubectlBinary is hack/kubectl.sh's kubectl (cached; built when missing).
func kubectlBinary(t *testing.T, repo string) string {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "hack", "kubectl.sh"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/kubectl.sh: %v\n%s", err, stderr.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("hack/kubectl.sh built kubectl in %s", d.Round(time.Second))
	}
	return filepath.Join(strings.TrimSpace(string(out)), "kubectl")
}

// cosignBinary is hack/cosign.sh's cosign when it is built (`make cosign`),
// "" when not: make test does not build it, and the docs' cosign lines are
// skipped then (step.needs).
func cosignBinary(t *testing.T, repo string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(repo, "hack", "cosign.sh"), "--cached")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		t.Logf("the docs' cosign lines are skipped: %s", strings.TrimSpace(stderr.String()))
		return ""
	}
	if err != nil {
		t.Fatalf("hack/cosign.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// goCmd runs the go command in dir and returns its standard output.
func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}
