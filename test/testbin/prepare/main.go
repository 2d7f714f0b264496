// Command prepare builds what test/testbin hands the tests of one run into a
// directory (hack/test.sh: a new one per run, exported as
// HYBRID_CCM_TEST_BIN): the release images of both architectures, this
// machine's binaries taken out of them, the development builds of the
// commands, and the tree they were built from.
//
//	go run ./test/testbin/prepare DIR
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/shiptest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: prepare DIR")
		os.Exit(2)
	}
	if err := prepare(context.Background(), os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "prepare:", err)
		os.Exit(1)
	}
}

func prepare(ctx context.Context, dir string) error {
	// The tree first: a change made while this builds makes the directory
	// refused, not wrong.
	root, err := ship.FindRoot()
	var tree string
	if err == nil {
		tree, err = testbin.Tree(root)
	}
	if err != nil {
		return err
	}
	// Tests run the binaries as other users too (hybridctl demo refusing an
	// unprivileged one): mktemp's 0700 would keep them out.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	start := time.Now()
	images := filepath.Join(dir, testbin.ImagesDir)
	if _, err := ship.Build(ctx, ship.Options{Root: root, Platforms: shiptest.Platforms(), Out: images}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "prepare: images of %v in %s\n", shiptest.Platforms(), time.Since(start).Round(time.Second))
	if err := extract(images, filepath.Join(dir, testbin.ReleaseDir)); err != nil {
		return err
	}
	start = time.Now()
	if err := testbin.BuildDev(filepath.Join(dir, testbin.DevDir), testbin.DevCommands...); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "prepare: development builds of %v in %s\n", testbin.DevCommands, time.Since(start).Round(time.Second))
	return os.WriteFile(filepath.Join(dir, testbin.TreeFile), []byte(tree+"\n"), 0o644)
}

// extract writes this machine's binary of every image of the layout into out,
// named as the image.
func extract(images, out string) error {
	root, err := layout.ImageIndexFromPath(images)
	if err == nil {
		err = os.MkdirAll(out, 0o755)
	}
	var im *v1.IndexManifest
	if err == nil {
		im, err = root.IndexManifest()
	}
	if err != nil {
		return err
	}
	for _, desc := range im.Manifests {
		ref := desc.Annotations[ship.AnnotationRefName]
		name := ref[strings.LastIndex(ref, "/")+1 : strings.LastIndex(ref, ":")]
		idx, err := root.ImageIndex(desc.Digest)
		var img v1.Image
		if err == nil {
			img, err = testbin.PlatformImage(idx, ship.HostPlatform())
		}
		if err == nil {
			err = testbin.ExtractBinary(img, name, filepath.Join(out, name))
		}
		if err != nil {
			return fmt.Errorf("%s: %w", ref, err)
		}
	}
	return nil
}
