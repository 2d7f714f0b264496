// Package testbin hands tests the binaries of the project's commands built
// once for a whole test run instead of once per package: `make test`
// (hack/test.sh) runs test/testbin/prepare into a directory of its own for the
// run and exports it as HYBRID_CCM_TEST_BIN. The directory holds
//
//   - images: the release images as hack/ship builds them (ship.Build, default
//     registry and version) for this machine's architecture and the other one
//     (shiptest.Platforms): the layout hack/ship's reproducibility test
//     compares its own build with. hack/test.sh has it built beside the
//     packages that run a real cluster, which do not need it (prepare's
//     stages);
//   - release/<command>: this machine's binary of each image, taken out of
//     it (static, stripped, the release's tags and version);
//   - dev/<command>: `go build ./cmd/<command>` with the run's flags (in
//     make test the release's compile flags, hack/test.sh) and no tags:
//     hybridctl with its demo;
//   - tree: the source it was built from (Tree), checked before any of it
//     is handed out, so a directory of another tree or of an older state of
//     this one is refused, never used.
//
// Without HYBRID_CCM_TEST_BIN (go test of one package) the callers build
// what they need themselves, as before. It imports nothing of the project but
// test/testenv: hack/ship's own tests use it.
package testbin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// Env names the run's directory.
const Env = "HYBRID_CCM_TEST_BIN"

// The directory's entries.
const (
	ImagesDir  = "images"
	ReleaseDir = "release"
	DevDir     = "dev"
	TreeFile   = "tree"
)

// DevCommands are the commands prepare builds into dev/.
var DevCommands = []string{"talos-ccm", "ccm-coordinator", "hybridctl"}

var (
	checkOnce sync.Once
	checkErr  error
)

// shared returns the run's directory, whether there is one, and an error when
// there is one that does not hold a build of this tree.
func shared() (string, bool, error) {
	dir := os.Getenv(Env)
	if dir == "" {
		return "", false, nil
	}
	checkOnce.Do(func() {
		want, err := os.ReadFile(filepath.Join(dir, TreeFile))
		if err != nil {
			checkErr = fmt.Errorf("%s=%s is not prepared (hack/test.sh runs `go run ./test/testbin/prepare DIR`): %w", Env, dir, err)
			return
		}
		got, err := Tree(testenv.RepoRoot())
		if err != nil {
			checkErr = fmt.Errorf("%s=%s: %w", Env, dir, err)
			return
		}
		if got != strings.TrimSpace(string(want)) {
			checkErr = fmt.Errorf("%s=%s was built from another state of the source (%s, now %s): unset it or prepare it again",
				Env, dir, strings.TrimSpace(string(want)), got)
		}
	})
	return dir, true, checkErr
}

// Images returns the run's image layout (see the package doc); ok is false
// without HYBRID_CCM_TEST_BIN.
func Images() (layout string, ok bool, err error) {
	dir, ok, err := shared()
	if !ok || err != nil {
		return "", ok, err
	}
	p := filepath.Join(dir, ImagesDir)
	if _, err := os.Stat(p); err != nil {
		return "", true, fmt.Errorf("%s=%s has no layout of both architectures yet (prepare -stage images): %w", Env, dir, err)
	}
	return p, true, nil
}

// Release returns this machine's binary of the image name as the run's images
// hold it; ok is false without HYBRID_CCM_TEST_BIN.
func Release(name string) (path string, ok bool, err error) {
	return file(ReleaseDir, name)
}

// Dev returns the development build of cmd/name: the run's with
// HYBRID_CCM_TEST_BIN, otherwise `go build` into dir.
func Dev(dir, name string) (string, error) {
	d, err := DevDirectory(dir, name)
	if err != nil {
		return "", err
	}
	return filepath.Join(d, name), nil
}

// DevDirectory returns a directory holding the development builds of
// cmd/<name> for every name: the run's with HYBRID_CCM_TEST_BIN, otherwise
// dir, built into it.
func DevDirectory(dir string, names ...string) (string, error) {
	if d, ok, err := shared(); ok {
		if err != nil {
			return "", err
		}
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(d, DevDir, n)); err != nil {
				return "", fmt.Errorf("%s=%s: %w", Env, d, err)
			}
		}
		return filepath.Join(d, DevDir), nil
	}
	return dir, BuildDev(dir, names...)
}

// BuildDev runs `go build -o dir/ ./cmd/<name>...` in the repository.
func BuildDev(dir string, names ...string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "./cmd/"+n)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func file(sub, name string) (string, bool, error) {
	dir, ok, err := shared()
	if !ok || err != nil {
		return "", ok, err
	}
	p := filepath.Join(dir, sub, name)
	if _, err := os.Stat(p); err != nil {
		return "", true, fmt.Errorf("%s=%s: %w", Env, dir, err)
	}
	return p, true, nil
}

// Tree identifies the content of the tracked files of the repository at root
// as the working tree has them, committed or not: one content, one string,
// whatever was committed since. It is empty outside a git checkout.
func Tree(root string) (string, error) {
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		return "", nil
	}
	git := func(stdin string, args ...string) ([]byte, error) {
		cmd := exec.Command("git", append([]string{"--no-optional-locks", "-C", root}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return out, nil
	}
	// The index's blob of every tracked file ("<mode> <blob> <stage>\t<path>")...
	index, err := git("", "ls-files", "-s", "-z")
	if err != nil {
		return "", err
	}
	blobs := map[string]string{}
	for _, e := range strings.Split(strings.TrimSuffix(string(index), "\x00"), "\x00") {
		meta, path, ok := strings.Cut(e, "\t")
		if f := strings.Fields(meta); ok && len(f) == 3 {
			blobs[path] = f[1]
		}
	}
	// ...where the working tree differs from HEAD, the blob of the file as it
	// is (hash-object without -w writes nothing), or none for a deleted one.
	diff, err := git("", "diff", "--name-only", "-z", "--no-renames", "HEAD")
	if err != nil {
		return "", err
	}
	var present []string
	for _, p := range strings.Split(strings.TrimSuffix(string(diff), "\x00"), "\x00") {
		if p == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			present = append(present, p)
		} else {
			delete(blobs, p)
		}
	}
	if len(present) > 0 {
		out, err := git(strings.Join(present, "\n")+"\n", "hash-object", "--stdin-paths")
		if err != nil {
			return "", err
		}
		for i, h := range strings.Fields(string(out)) {
			blobs[present[i]] = h
		}
	}
	paths := make([]string, 0, len(blobs))
	for p := range blobs {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	h := sha256.New()
	for _, p := range paths {
		fmt.Fprintf(h, "%s %s\n", blobs[p], p)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
