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
	root, err := ship.FindRoot()
	if err != nil {
		return err
	}
	// The tree first: a change made while this builds makes the directory
	// refused, not wrong.
	tree, err := testbin.Tree(root)
	if err != nil {
		return err
	}
	start := time.Now()
	images := filepath.Join(dir, testbin.ImagesDir)
	refs, err := ship.Build(ctx, ship.Options{Root: root, Platforms: shiptest.Platforms(), Out: images})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "prepare: images of %v in %s\n", shiptest.Platforms(), time.Since(start).Round(time.Second))
	if err := extract(root, images, filepath.Join(dir, testbin.ReleaseDir), refs); err != nil {
		return err
	}
	start = time.Now()
	if err := testbin.BuildDev(filepath.Join(dir, testbin.DevDir), testbin.DevCommands...); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "prepare: development builds of %v in %s\n", testbin.DevCommands, time.Since(start).Round(time.Second))
	return os.WriteFile(filepath.Join(dir, testbin.TreeFile), []byte(tree+"\n"), 0o644)
}

// extract writes this machine's binary of every image of the layout into out.
func extract(root, images, out string, refs map[string]v1.Hash) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	lp, err := layout.FromPath(images)
	if err != nil {
		return err
	}
	version, err := ship.DefaultVersion(root)
	if err != nil {
		return err
	}
	for _, name := range ship.Images {
		ref := ship.ImageRef(ship.DefaultRegistry, name, version)
		d, ok := refs[ref]
		if !ok {
			return fmt.Errorf("%s: no %s", images, ref)
		}
		idx, err := lp.ImageIndex()
		if err != nil {
			return err
		}
		ii, err := idx.ImageIndex(d)
		if err != nil {
			return err
		}
		img, err := testbin.PlatformImage(ii, ship.HostPlatform())
		if err != nil {
			return fmt.Errorf("%s: %w", ref, err)
		}
		if err := testbin.ExtractBinary(img, name, filepath.Join(out, name)); err != nil {
			return fmt.Errorf("%s: %w", ref, err)
		}
	}
	return nil
}
