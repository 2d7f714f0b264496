package podrunner_test

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/hybrid-ccm/hybrid-ccm/test/netns"
	"github.com/hybrid-ccm/hybrid-ccm/test/podrunner"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

const (
	// testImage is in the test's OCI layout; mappedImage is mapped to the
	// same binary.
	testImage   = "ghcr.io/hybrid-ccm/testpod:0.1.0"
	mappedImage = "registry.example/upstream/ccm:v1.0.0"
)

var (
	env       *testenv.Env
	layoutDir string
	binary    string
)

func TestMain(m *testing.M) {
	// The test pods listen on fixed ports: a network namespace of the
	// package's own keeps them apart from every other package's.
	os.Exit(netns.Main(func() int { return run(m) }))
}

func run(m *testing.M) int {
	if os.Getuid() != 0 {
		// not a skip: CI and developers run the tests as root
		fmt.Fprintln(os.Stderr, "podrunner tests need root (mount namespaces, chroot, setuid)")
		return 1
	}
	dir, err := os.MkdirTemp("", "podrunner-test-")
	if err != nil {
		panic(err)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "testpod")
		build := exec.Command("go", "build", "-o", binary, "./internal/testpod")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build testpod: %v\n%s", err, out)
			return 1
		}
		layoutDir = filepath.Join(dir, "layout")
		if err := writeLayout(layoutDir, testImage, binary); err != nil {
			fmt.Fprintln(os.Stderr, "OCI layout:", err)
			return 1
		}
		return testenv.Run(m, testenv.Options{}, func(e *testenv.Env) { env = e })
	}()
	return code
}

// writeLayout writes an OCI layout holding ref as an index of linux/amd64 and
// linux/arm64 images of the binary at /testpod, running as 65532:65532.
func writeLayout(dir, ref, bin string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "work/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "testpod", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return err
	}
	idx := v1.ImageIndex(empty.Index)
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := mutate.AppendLayers(empty.Image, layer)
		if err != nil {
			return err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", arch
		cf.Config = v1.Config{
			Entrypoint: []string{"/testpod"},
			Cmd:        []string{"--name=from-image-cmd"},
			Env:        []string{"PATH=/usr/bin:/", "FROM_IMAGE=image", "OVERRIDDEN=image"},
			User:       "65532:65532",
			WorkingDir: "/work",
		}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{podrunner.RefNameAnnotation: ref}))
}
