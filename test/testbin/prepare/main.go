// Command prepare builds what test/testbin hands the tests of one run into a
// directory (hack/test.sh: a new one per run, exported as
// HYBRID_CCM_TEST_BIN): the release images of both architectures, this
// machine's binaries taken out of them, the development builds of the
// commands, and the tree they were built from.
//
//	go run ./test/testbin/prepare [-stage all|host|images] DIR
//
// It builds in two stages that hack/test.sh runs apart, so that the packages
// running a real cluster (which need only this machine's binaries) start
// while the other architecture still compiles:
//
//   - host: the release images of this machine's platform (a layout of their
//     own, host-images/), the binaries taken out of them, the development
//     builds, and the tree;
//   - images: the release images of both architectures into images/, the
//     layout hack/ship's reproducibility test compares with. It is written
//     beside and renamed into place when whole, so a reader never sees half
//     of it; the host stage must have run (the tree it recorded is checked).
//
// all (the default) runs both.
package main

import (
	"context"
	"flag"
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

// hostImagesDir is the host stage's layout: this machine's platform only.
const hostImagesDir = "host-images"

func main() {
	stage := flag.String("stage", "all", "what to build: all, host (this machine's images and binaries, the development builds) or images (both architectures' layout; after host)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: prepare [-stage all|host|images] DIR")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	dir := flag.Arg(0)
	ctx := context.Background()
	var err error
	switch *stage {
	case "all":
		if err = prepareHost(ctx, dir); err == nil {
			err = prepareImages(ctx, dir)
		}
	case "host":
		err = prepareHost(ctx, dir)
	case "images":
		err = prepareImages(ctx, dir)
	default:
		fmt.Fprintf(os.Stderr, "prepare: -stage %q: want all, host or images\n", *stage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "prepare:", err)
		os.Exit(1)
	}
}

// rootTree returns the repository's root and its tree (testbin.Tree).
func rootTree() (root, tree string, err error) {
	if root, err = ship.FindRoot(); err == nil {
		tree, err = testbin.Tree(root)
	}
	return root, tree, err
}

// prepareHost is the host stage (see the command's doc).
func prepareHost(ctx context.Context, dir string) error {
	// The tree first: a change made while this builds makes the directory
	// refused, not wrong.
	root, tree, err := rootTree()
	if err != nil {
		return err
	}
	// Tests run the binaries as other users too (hybridctl demo refusing an
	// unprivileged one): mktemp's 0700 would keep them out.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	start := time.Now()
	images := filepath.Join(dir, hostImagesDir)
	if _, err := ship.Build(ctx, ship.Options{Root: root, Platforms: []string{ship.HostPlatform()}, Out: images}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "prepare: images of %s in %s\n", ship.HostPlatform(), time.Since(start).Round(time.Second))
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

// prepareImages is the images stage (see the command's doc): both
// architectures' layout, of the tree the host stage recorded.
func prepareImages(ctx context.Context, dir string) error {
	root, tree, err := rootTree()
	if err != nil {
		return err
	}
	recorded, err := os.ReadFile(filepath.Join(dir, testbin.TreeFile))
	if err != nil {
		return fmt.Errorf("the host stage has not run in %s: %w", dir, err)
	}
	if strings.TrimSpace(string(recorded)) != tree {
		return fmt.Errorf("%s was prepared from another state of the source (%s, now %s)", dir, strings.TrimSpace(string(recorded)), tree)
	}
	start := time.Now()
	images := filepath.Join(dir, testbin.ImagesDir)
	partial := images + ".partial"
	if err := os.RemoveAll(partial); err != nil {
		return err
	}
	if _, err := ship.Build(ctx, ship.Options{Root: root, Platforms: shiptest.Platforms(), Out: partial}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "prepare: images of %v in %s\n", shiptest.Platforms(), time.Since(start).Round(time.Second))
	return os.Rename(partial, images)
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
