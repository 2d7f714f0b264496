package ship

import (
	"archive/tar"
	"context"
	"debug/elf"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/shiptest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestBuildReproducible builds every image for both architectures twice (the
// second build from a warm Go build cache) and requires identical digests;
// it then checks the layout contract other code relies on and runs the
// host's hybridctl binary taken out of its image. In a run that built the
// images once for all its tests (test/testbin), that build, made by another
// process from a cold cache, is the first.
func TestBuildReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles four commands for two architectures twice")
	}
	ctx := context.Background()
	root := testenv.RepoRoot()
	var digests [2]map[string]v1.Hash
	dirs := [2]string{filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")}
	first := 0
	if shared, ok, err := testbin.Images(); err != nil {
		t.Fatal(err)
	} else if ok {
		dirs[0], digests[0], first = shared, layoutRefs(t, shared), 1
		t.Logf("build 1: the run's, %s", shared)
	}
	for i := first; i < len(digests); i++ {
		start := time.Now()
		var err error
		digests[i], err = Build(ctx, Options{Root: root, Platforms: shiptest.Platforms(), Out: dirs[i], Log: shiptest.Log{T: t}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("build %d of %s: %s", i+1, strings.Join(shiptest.Platforms(), ", "), time.Since(start).Round(time.Millisecond))
	}
	if !maps.Equal(digests[0], digests[1]) {
		t.Fatalf("two builds of one commit differ:\n%v\n%v", digests[0], digests[1])
	}
	version, err := DefaultVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range Images {
		want = append(want, ImageRef(DefaultRegistry, name, version))
	}
	if got := slices.Sorted(maps.Keys(digests[0])); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("built %v, want %v", got, want)
	}
	checkLayout(t, dirs[1], digests[1], shiptest.Platforms())

	// The host's binaries are static and run.
	idx := layoutIndex(t, dirs[1], ImageRef(DefaultRegistry, "hybridctl", version))
	bin := shiptest.ExtractBinary(t, shiptest.PlatformImage(t, idx, HostPlatform()), "hybridctl")
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "transform") {
		t.Errorf("hybridctl --help from the image: %v\n%s", err, out)
	}
}

// checkLayout checks the contract of Build's output: index.json lists exactly
// the references of refs (ref.name annotations), each an OCI image index of
// the platforms, each image one layer holding only the static binary at
// /<name>, run as 65532:65532 from /, with the OCI labels.
func checkLayout(t *testing.T, dir string, refs map[string]v1.Hash, platforms []string) {
	t.Helper()
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	root, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := root.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != len(refs) {
		t.Fatalf("index.json has %d entries, want %d", len(im.Manifests), len(refs))
	}
	for _, desc := range im.Manifests {
		ref := desc.Annotations[AnnotationRefName]
		if want, ok := refs[ref]; !ok || desc.Digest != want {
			t.Errorf("index.json entry %s %s, want one of %v", ref, desc.Digest, refs)
			continue
		}
		if desc.MediaType != types.OCIImageIndex {
			t.Errorf("%s: media type %s", ref, desc.MediaType)
		}
		name := ref[strings.LastIndex(ref, "/")+1 : strings.LastIndex(ref, ":")]
		idx, err := root.ImageIndex(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		ixm, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range ixm.Manifests {
			got = append(got, m.Platform.OS+"/"+m.Platform.Architecture)
		}
		if !slices.Equal(got, platforms) {
			t.Errorf("%s: platforms %v, want %v", ref, got, platforms)
		}
		if ixm.Annotations[AnnotationSource] != Source || ixm.Annotations[AnnotationVersion] == "" || ixm.Annotations[AnnotationRevision] == "" ||
			ixm.Annotations[AnnotationLicenses] != License {
			t.Errorf("%s: index annotations %v", ref, ixm.Annotations)
		}
		for _, p := range platforms {
			img := shiptest.PlatformImage(t, idx, p)
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cf.Config
			if !slices.Equal(c.Entrypoint, []string{"/" + name}) || c.User != User || c.WorkingDir != "/" || len(c.Cmd) != 0 {
				t.Errorf("%s %s: entrypoint %v cmd %v user %q workdir %q", ref, p, c.Entrypoint, c.Cmd, c.User, c.WorkingDir)
			}
			if cf.OS+"/"+cf.Architecture != p {
				t.Errorf("%s %s: config says %s/%s", ref, p, cf.OS, cf.Architecture)
			}
			for _, k := range []string{AnnotationSource, AnnotationRevision, AnnotationVersion, AnnotationLicenses} {
				if c.Labels[k] == "" || c.Labels[k] != ixm.Annotations[k] {
					t.Errorf("%s %s: label %s = %q, index annotation %q", ref, p, k, c.Labels[k], ixm.Annotations[k])
				}
			}
			checkLayer(t, img, name, p)
		}
	}
}

// checkLayer requires the image's only layer to hold only /<name>: a static
// ELF for the platform's architecture, root's, mode 0555.
func checkLayer(t *testing.T, img v1.Image, name, platform string) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%s %s: %d layers (%v), want 1", name, platform, len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var entries []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, hdr.Name)
		if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Mode != 0o555 || hdr.Typeflag != tar.TypeReg {
			t.Errorf("%s %s: %s uid %d gid %d mode %o type %c", name, platform, hdr.Name, hdr.Uid, hdr.Gid, hdr.Mode, hdr.Typeflag)
		}
		f, err := os.CreateTemp(t.TempDir(), name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		f.Close()
		ef, err := elf.Open(f.Name())
		if err != nil {
			t.Fatalf("%s %s: %v", name, platform, err)
		}
		wantMachine := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}[platform]
		if ef.Machine != wantMachine {
			t.Errorf("%s %s: ELF for %s", name, platform, ef.Machine)
		}
		for _, prog := range ef.Progs {
			if prog.Type == elf.PT_INTERP {
				t.Errorf("%s %s: dynamically linked (has an interpreter)", name, platform)
			}
		}
		ef.Close()
	}
	if !slices.Equal(entries, []string{name}) {
		t.Errorf("%s %s: layer holds %v, want only %s", name, platform, entries, name)
	}
}

// layoutIndex returns the image index of ref in the layout at dir.
func layoutIndex(t *testing.T, dir, ref string) v1.ImageIndex {
	t.Helper()
	root, im := layoutRoot(t, dir)
	for _, d := range im.Manifests {
		if d.Annotations[AnnotationRefName] == ref {
			idx, err := root.ImageIndex(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return idx
		}
	}
	t.Fatalf("%s: no image %s", dir, ref)
	return nil
}

// layoutRefs are the references of the layout dir (ref.name annotations) and
// their digests, as Build returns them.
func layoutRefs(t *testing.T, dir string) map[string]v1.Hash {
	t.Helper()
	_, im := layoutRoot(t, dir)
	refs := map[string]v1.Hash{}
	for _, d := range im.Manifests {
		refs[d.Annotations[AnnotationRefName]] = d.Digest
	}
	return refs
}

// layoutRoot is the index.json of the layout dir.
func layoutRoot(t *testing.T, dir string) (v1.ImageIndex, *v1.IndexManifest) {
	t.Helper()
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	root, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := root.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	return root, im
}

// TestLockLayout: a second build of one layout waits, saying so, until the
// first is done, and gives up when its context ends.
func TestLockLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bin", "images")
	unlock, err := LockLayout(t.Context(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	var log strings.Builder
	if _, err := LockLayout(ctx, dir, &log); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: %v, want the context's deadline", err)
	}
	if want := "waiting for another build writing " + dir; !strings.Contains(log.String(), want) {
		t.Errorf("second lock said %q, want %q", log.String(), want)
	}

	got := make(chan error, 1)
	go func() {
		u, err := LockLayout(t.Context(), dir, io.Discard)
		if err == nil {
			u()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a third lock returned (%v) while the first is held", err)
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	if err := <-got; err != nil {
		t.Fatalf("lock after the holder let go: %v", err)
	}
}
