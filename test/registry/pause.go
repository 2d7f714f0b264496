package registry

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// PauseImage is the sandbox image PushPause pushes, under the name a
// containerd 1.6 default configuration pulls it by (as containerd's
// sandbox_image; containerd pulls it from this registry through
// WriteHostsDir's registry.k8s.io mapping).
const PauseImage = "registry.k8s.io/pause:3.10"

// PauseUser is the user the pause image runs as, as upstream's does.
const PauseUser = "65535:65535"

// pausePackage is the pause program, relative to the repository root.
const pausePackage = "./test/registry/pause"

// BuildPause compiles the pause program (test/registry/pause) statically
// (CGO_ENABLED=0, -trimpath, stripped, for linux/GOARCH) into outDir/pause
// and returns its path. It runs the go command in the repository around the
// working directory.
func BuildPause(ctx context.Context, outDir string) (string, error) {
	root, err := ship.FindRoot()
	if err != nil {
		return "", fmt.Errorf("build pause: %w", err)
	}
	out, err := filepath.Abs(filepath.Join(outDir, "pause"))
	if err != nil {
		return "", fmt.Errorf("build pause: %w", err)
	}
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", out, pausePackage}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build pause: go %s: %w\n%s", strings.Join(args, " "), err, output.String())
	}
	return out, nil
}

// PushPause builds the pause program and pushes it as PauseImage (stored at
// Mirror(PauseImage)): /pause, its entrypoint, run as PauseUser. It returns
// the reference containerd's sandbox_image names: PauseImage.
func (r *Registry) PushPause(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "hybrid-ccm-pause-")
	if err != nil {
		return "", fmt.Errorf("push pause image: %w", err)
	}
	defer os.RemoveAll(dir)
	bin, err := BuildPause(ctx, dir)
	if err != nil {
		return "", fmt.Errorf("push pause image: %w", err)
	}
	if _, err := r.PushBinary(ctx, PauseImage, bin, ImageOptions{Path: "/pause", User: PauseUser}); err != nil {
		return "", fmt.Errorf("push pause image: %w", err)
	}
	return PauseImage, nil
}
