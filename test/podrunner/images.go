package podrunner

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// RefNameAnnotation names an image in an OCI layout's index.json.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// binaryDir is where a mapped binary sits in its container's root.
const binaryDir = "/usr/local/bin"

// Images resolves a pod's image references to something runnable: an image of
// an OCI layout (`make images`) or a binary a test built. The zero value knows
// no image.
type Images struct {
	mu       sync.Mutex
	layouts  []string
	binaries map[string]string // reference (normalized) -> binary path
}

// LayoutImages knows every image named (annotation
// org.opencontainers.image.ref.name) in the OCI image layout at dir.
func LayoutImages(dir string) (*Images, error) {
	if _, err := layout.ImageIndexFromPath(dir); err != nil {
		return nil, fmt.Errorf("podrunner: OCI layout %s: %w", dir, err)
	}
	return &Images{layouts: []string{dir}}, nil
}

// AddLayout adds the images of another OCI layout; earlier layouts win.
func (im *Images) AddLayout(dir string) error {
	if _, err := layout.ImageIndexFromPath(dir); err != nil {
		return fmt.Errorf("podrunner: OCI layout %s: %w", dir, err)
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	im.layouts = append(im.layouts, dir)
	return nil
}

// Map makes ref run binaryPath: the container's root holds only that binary,
// at /usr/local/bin/<base name>, which is also the image's entrypoint. A
// mapping wins over the layouts. It returns im for chaining.
func (im *Images) Map(ref, binaryPath string) *Images {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.binaries == nil {
		im.binaries = map[string]string{}
	}
	im.binaries[normalizeRef(ref)] = binaryPath
	return im
}

// image is a resolved image reference.
type image struct {
	ref    string
	digest string // empty for a mapped binary
	config v1.Config
	img    v1.Image // nil for a mapped binary
	binary string   // host path of a mapped binary
}

// errUnknownImage is wrapped by resolve when no layout or mapping has the image.
var errUnknownImage = errors.New("unknown image")

func normalizeRef(ref string) string {
	r, err := name.ParseReference(ref)
	if err != nil {
		return ref
	}
	return r.Name()
}

// resolve finds ref for linux/runtime.GOARCH.
func (im *Images) resolve(ref string) (*image, error) {
	if im == nil {
		return nil, fmt.Errorf("%w %q: no images configured", errUnknownImage, ref)
	}
	im.mu.Lock()
	bin, mapped := im.binaries[normalizeRef(ref)]
	layouts := append([]string(nil), im.layouts...)
	im.mu.Unlock()
	if mapped {
		base := filepath.Base(bin)
		return &image{ref: ref, binary: bin, config: v1.Config{
			Entrypoint: []string{binaryDir + "/" + base},
			Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		}}, nil
	}
	want := normalizeRef(ref)
	var digest string
	if d, err := name.NewDigest(ref); err == nil {
		digest = d.DigestStr()
	}
	for _, dir := range layouts {
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
		}
		m, err := idx.IndexManifest()
		if err != nil {
			return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
		}
		for _, d := range m.Manifests {
			named := d.Annotations[RefNameAnnotation]
			if !(named != "" && normalizeRef(named) == want) && !(digest != "" && d.Digest.String() == digest) {
				continue
			}
			img, err := platformImage(idx, d)
			if err != nil {
				return nil, fmt.Errorf("image %s in OCI layout %s: %w", ref, dir, err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				return nil, fmt.Errorf("image %s in OCI layout %s: config: %w", ref, dir, err)
			}
			dg, _ := img.Digest()
			return &image{ref: ref, digest: dg.String(), config: cf.Config, img: img}, nil
		}
	}
	return nil, fmt.Errorf("%w %q (not mapped to a binary, not in OCI layouts %v)", errUnknownImage, ref, layouts)
}

// platformImage picks linux/GOARCH out of an index entry (an image index or a
// single image).
func platformImage(idx v1.ImageIndex, d v1.Descriptor) (v1.Image, error) {
	if !d.MediaType.IsIndex() {
		return idx.Image(d.Digest)
	}
	child, err := idx.ImageIndex(d.Digest)
	if err != nil {
		return nil, err
	}
	m, err := child.IndexManifest()
	if err != nil {
		return nil, err
	}
	var have []string
	for _, c := range m.Manifests {
		if c.Platform == nil {
			continue
		}
		have = append(have, c.Platform.OS+"/"+c.Platform.Architecture)
		if c.Platform.OS == "linux" && c.Platform.Architecture == runtime.GOARCH {
			return child.Image(c.Digest)
		}
	}
	return nil, fmt.Errorf("no linux/%s manifest (has %v)", runtime.GOARCH, have)
}

// unpack writes the image's file system into root.
func (i *image) unpack(root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	if i.img == nil {
		dir := filepath.Join(root, binaryDir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// The binary is bind-mounted here by the sandbox.
		f, err := os.OpenFile(filepath.Join(dir, filepath.Base(i.binary)), os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			return err
		}
		return f.Close()
	}
	rc := mutate.Extract(i.img)
	defer rc.Close()
	return untar(tar.NewReader(rc), root)
}

func untar(tr *tar.Reader, root string) error {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("extract: %w", err)
		}
		rel := filepath.Clean("/" + h.Name)
		if rel == "/" {
			continue
		}
		target := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(h.Mode).Perm() | os.FileMode(h.Mode)&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, mode); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			_ = os.Remove(target)
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			src := filepath.Join(root, filepath.Clean("/"+h.Linkname))
			if !strings.HasPrefix(src, root) {
				return fmt.Errorf("extract: hard link %s outside the root", h.Name)
			}
			_ = os.Remove(target)
			if err := os.Link(src, target); err != nil {
				return err
			}
		default:
			continue // devices, fifos: not needed by static Go images
		}
		_ = os.Lchown(target, h.Uid, h.Gid)
		if h.Typeflag != tar.TypeSymlink {
			_ = os.Chmod(target, mode)
		}
	}
}
