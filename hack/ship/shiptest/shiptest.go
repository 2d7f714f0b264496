// Package shiptest holds helpers for the tests of hack/ship and
// hack/ship/publish: the platforms a test builds, its log, and reading an
// image's binary back. Only tests import it.
package shiptest

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
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
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range im.Manifests {
		if m.Platform != nil && m.Platform.OS+"/"+m.Platform.Architecture == platform {
			img, err := idx.Image(m.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}
	}
	t.Fatalf("no image for %s", platform)
	return nil
}

// ExtractBinary writes /<name> of img into a temporary file and returns its
// path.
func ExtractBinary(t *testing.T, img v1.Image, name string) string {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("no %s in the image: %v", name, err)
		}
		if hdr.Name != name {
			continue
		}
		p := filepath.Join(t.TempDir(), name)
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return p
	}
}
