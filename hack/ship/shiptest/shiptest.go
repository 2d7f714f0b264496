// Package shiptest holds helpers for the tests of hack/ship and
// hack/ship/publish: the platforms a test builds, its log, and reading an
// image's binary back. Only tests import it.
package shiptest

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
)

// Platforms are the host's platform and arm64 (amd64 on an arm64 host):
// both architectures of a release.
func Platforms() []string {
	other := "linux/arm64"
	if runtime.GOARCH == "arm64" {
		other = "linux/amd64"
	}
	return []string{"linux/" + runtime.GOARCH, other}
}

// Log writes a build's progress to the test log (ship.Options.Log).
type Log struct{ T *testing.T }

func (l Log) Write(p []byte) (int, error) {
	l.T.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// PlatformImage returns the image of one os/arch in an image index.
func PlatformImage(t *testing.T, idx v1.ImageIndex, platform string) v1.Image {
	t.Helper()
	img, err := testbin.PlatformImage(idx, platform)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// ExtractBinary writes /<name> of img into a temporary file and returns its
// path.
func ExtractBinary(t *testing.T, img v1.Image, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := testbin.ExtractBinary(img, name, p); err != nil {
		t.Fatal(err)
	}
	return p
}
