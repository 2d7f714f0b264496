package registry

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// writeBinary writes size random bytes: PushBinary packs any file.
func writeBinary(t *testing.T, size int) (path string, data []byte) {
	t.Helper()
	data = make([]byte, size)
	rand.Read(data)
	path = filepath.Join(t.TempDir(), "thing")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return path, data
}

// layerFile is one entry of a layer.
type layerFile struct {
	name  string
	typ   byte
	mode  int64
	uid   int
	gid   int
	mtime time.Time
}

// readLayer returns a single-layer image's entries and the content of file.
func readLayer(t *testing.T, img v1.Image, file string) ([]layerFile, []byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	if mt, err := layers[0].MediaType(); err != nil || mt != types.OCILayer {
		t.Errorf("layer media type %s (%v), want %s", mt, err, types.OCILayer)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var entries []layerFile
	var content []byte
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, layerFile{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.ModTime.UTC()})
		if h.Name == file {
			if content, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return entries, content
}

func TestPushBinary(t *testing.T) {
	r := start(t)
	bin, data := writeBinary(t, 3<<20)
	ref := "registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.2"
	digest, err := r.PushBinary(t.Context(), ref, bin, ImageOptions{
		Path: "/usr/local/bin/thing",
		Cmd:  []string{"--v=2"},
		Env:  []string{"A=b"},
	})
	if err != nil {
		t.Fatal(err)
	}

	// Pulled back from where Mirror says, over HTTPS with the registry's CA.
	stored, err := name.ParseReference(r.Host() + "/registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.2")
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(stored, remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img.Digest(); d != digest {
		t.Errorf("pulled digest %s, PushBinary returned %s", d, digest)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", mt)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/thing"}) || !slices.Equal(c.Cmd, []string{"--v=2"}) ||
		!slices.Equal(c.Env, []string{"A=b"}) || c.User != NonRootUser || c.WorkingDir != "/" {
		t.Errorf("config %+v", c)
	}
	if !cf.Created.Equal(time.Unix(0, 0)) {
		t.Errorf("created %s, want the Unix epoch", cf.Created)
	}

	entries, content := readLayer(t, img, "usr/local/bin/thing")
	epoch := time.Unix(0, 0).UTC()
	want := []layerFile{
		{"usr/", tar.TypeDir, 0o755, 0, 0, epoch},
		{"usr/local/", tar.TypeDir, 0o755, 0, 0, epoch},
		{"usr/local/bin/", tar.TypeDir, 0o755, 0, 0, epoch},
		{"usr/local/bin/thing", tar.TypeReg, 0o555, 0, 0, epoch},
	}
	if !slices.Equal(entries, want) {
		t.Errorf("layer entries\n%+v\nwant\n%+v", entries, want)
	}
	if !bytes.Equal(content, data) {
		t.Errorf("file content differs from the binary (%d bytes, want %d)", len(content), len(data))
	}

	// By digest, through Mirror.
	byDigest, err := r.Mirror(ref[:len(ref)-len(":v1.36.2")] + "@" + digest.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Head(byDigest, remote.WithTransport(r.HTTPClient().Transport)); err != nil {
		t.Errorf("HEAD %s: %v", byDigest, err)
	}

	// Reproducible: the same binary and options, the same digest, pushed
	// anywhere; another time, another digest.
	again, err := r.PushBinary(t.Context(), r.Host()+"/elsewhere/thing:1", bin, ImageOptions{Path: "/usr/local/bin/thing", Cmd: []string{"--v=2"}, Env: []string{"A=b"}})
	if err != nil {
		t.Fatal(err)
	}
	if again != digest {
		t.Errorf("second push %s, first %s", again, digest)
	}
	later, err := r.PushBinary(t.Context(), r.Host()+"/elsewhere/thing:2", bin, ImageOptions{Path: "/usr/local/bin/thing", Cmd: []string{"--v=2"}, Env: []string{"A=b"}, Created: time.Unix(1700000000, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if later == digest {
		t.Error("another Created time gave the same digest")
	}
}

// Defaults: the binary at /<base name>, its own entrypoint, the non-root user.
func TestPushBinaryDefaults(t *testing.T) {
	r := start(t)
	bin, _ := writeBinary(t, 1000)
	if _, err := r.PushBinary(t.Context(), "hetznercloud/hcloud-cloud-controller-manager:v1.35.0", bin, ImageOptions{}); err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(r.Host() + "/docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.35.0")
	img, err := remote.Image(ref, remote.WithTransport(r.HTTPClient().Transport))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/thing"}) || cf.Config.Cmd != nil || cf.Config.User != "65532:65532" || cf.Config.WorkingDir != "/" {
		t.Errorf("config %+v", cf.Config)
	}
	entries, _ := readLayer(t, img, "thing")
	if len(entries) != 1 || entries[0].name != "thing" || entries[0].mode != 0o555 {
		t.Errorf("layer entries %+v, want only thing, 0555", entries)
	}
}

func TestPushBinaryErrors(t *testing.T) {
	r := start(t)
	bin, _ := writeBinary(t, 10)
	for _, tc := range []struct {
		ref, bin, path string
	}{
		{"registry.k8s.io/x:1", filepath.Join(t.TempDir(), "missing"), ""},
		{"registry.k8s.io/x:1", t.TempDir(), ""},
		{"registry.k8s.io/x:1", bin, "relative/path"},
		{"registry.k8s.io/x:1", bin, "/a/../b"},
		{"registry.k8s.io/x:1", bin, "/"},
		{"Registry.k8s.io/X:1", bin, ""},
	} {
		if _, err := r.PushBinary(t.Context(), tc.ref, tc.bin, ImageOptions{Path: tc.path}); err == nil {
			t.Errorf("PushBinary(%q, %q, path %q) succeeded", tc.ref, tc.bin, tc.path)
		} else {
			t.Logf("PushBinary(%q, %q, path %q): %v", tc.ref, tc.bin, tc.path, err)
		}
	}
}

// Capabilities: the binary carries them as the security.capability extended
// attribute of the layer's entry (what containerd sets when it unpacks the
// layer), in the kernel's format: permitted and effective, nothing
// inheritable. As root, the kernel takes the value on a file of its own.
func TestPushBinaryCapabilities(t *testing.T) {
	r := start(t)
	bin, _ := writeBinary(t, 1000)
	digest, err := r.PushBinary(t.Context(), "registry.k8s.io/coredns/coredns:v1.15.0", bin, ImageOptions{Path: "/coredns", Capabilities: []string{"CAP_NET_BIND_SERVICE"}})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(r.Host() + "/registry.k8s.io/coredns/coredns:v1.15.0")
	img, err := remote.Image(ref, remote.WithTransport(r.HTTPClient().Transport))
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h, err := tar.NewReader(rc).Next()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := h.PAXRecords["SCHILY.xattr.security.capability"]
	if h.Name != "coredns" || !ok {
		t.Fatalf("entry %s, PAX records %q: want coredns with security.capability", h.Name, h.PAXRecords)
	}
	b := []byte(v)
	if len(b) != 20 {
		t.Fatalf("security.capability is %d bytes, want 20 (VFS_CAP_REVISION_2)", len(b))
	}
	word := func(i int) uint32 { return binary.LittleEndian.Uint32(b[4*i:]) }
	if magic := word(0); magic&0xff000000 != 0x02000000 || magic&1 != 1 {
		t.Errorf("magic %#x, want revision 2 with the effective flag", magic)
	}
	if perm, inh := uint64(word(1))|uint64(word(3))<<32, uint64(word(2))|uint64(word(4))<<32; perm != 1<<unix.CAP_NET_BIND_SERVICE || inh != 0 {
		t.Errorf("permitted %#x inheritable %#x, want only CAP_NET_BIND_SERVICE permitted", perm, inh)
	}
	if os.Geteuid() == 0 {
		f := filepath.Join(t.TempDir(), "coredns")
		if err := os.WriteFile(f, nil, 0o555); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(f, "security.capability", b, 0); err != nil {
			t.Errorf("the kernel refuses the value: %v", err)
		}
	}
	plain, err := r.PushBinary(t.Context(), r.Host()+"/elsewhere/coredns:1", bin, ImageOptions{Path: "/coredns"})
	if err != nil {
		t.Fatal(err)
	}
	if plain == digest {
		t.Error("an image without capabilities has the same digest")
	}
	if _, err := r.PushBinary(t.Context(), r.Host()+"/elsewhere/coredns:2", bin, ImageOptions{Capabilities: []string{"CAP_SYS_ADMIN"}}); err == nil || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") {
		t.Errorf("an unknown capability: %v, want a refusal naming it", err)
	}
}
