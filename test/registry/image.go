package registry

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRootUser is the user and group an image runs as unless ImageOptions say
// otherwise: the release images' (hack/ship), numeric, so no /etc/passwd is
// needed and runAsNonRoot accepts it.
const NonRootUser = "65532:65532"

// ImageOptions describe the image PushBinary makes of a binary.
type ImageOptions struct {
	// Path of the binary in the image, absolute. Empty: "/" + its base name.
	Path string
	// Entrypoint of the image. Empty: [Path].
	Entrypoint []string
	// Cmd: the default arguments.
	Cmd []string
	// Env: KEY=value pairs.
	Env []string
	// User the image runs as, uid:gid. Empty: NonRootUser.
	User string
	// Created is the time of the image config and of every file in the
	// layer. Zero: the Unix epoch.
	Created time.Time
	// Capabilities are file capabilities of the binary, permitted and
	// effective, as `setcap <name>=+ep` gives them (capabilities(7) names,
	// e.g. CAP_NET_BIND_SERVICE): how a server image that runs as a
	// non-root user binds a port below 1024 (CoreDNS's on 53). The
	// container must still be allowed the capability (its securityContext
	// adds it to the bounding set).
	Capabilities []string
}

// fileCapabilities are the capabilities ImageOptions.Capabilities may name,
// by their bit.
var fileCapabilities = map[string]uint{
	"CAP_NET_BIND_SERVICE": 10,
}

// capabilityXattr is the value of the security.capability extended
// attribute (VFS_CAP_REVISION_2, little endian) that makes caps the file's
// permitted and effective capabilities.
func capabilityXattr(caps []string) (string, error) {
	var permitted [2]uint32
	for _, c := range caps {
		bit, ok := fileCapabilities[c]
		if !ok {
			return "", fmt.Errorf("file capability %q: want one of %v", c, slices.Sorted(maps.Keys(fileCapabilities)))
		}
		permitted[bit/32] |= 1 << (bit % 32)
	}
	const revision2, effective = 0x02000000, 0x000001
	b := binary.LittleEndian.AppendUint32(nil, revision2|effective)
	for _, p := range permitted {
		b = binary.LittleEndian.AppendUint32(b, p) // permitted
		b = binary.LittleEndian.AppendUint32(b, 0) // inheritable
	}
	return string(b), nil
}

// PushBinary pushes an image of one static binary for this machine's
// platform (linux/GOARCH) to Mirror(ref): one layer holding the binary at
// opts.Path (mode 0555, root's; its parent directories 0755), nothing else —
// no shell, no /etc. The config has OS and architecture, Entrypoint, Cmd,
// Env, User and WorkingDir "/". Every timestamp is opts.Created, so one
// binary gives one digest. It returns the digest of the image manifest.
func (r *Registry) PushBinary(ctx context.Context, ref, binary string, opts ImageOptions) (v1.Hash, error) {
	img, err := binaryImage(binary, opts)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image of %s for %s: %w", binary, ref, err)
	}
	target, err := r.Mirror(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Write(target, img, remote.WithContext(ctx), remote.WithTransport(r.transport), remote.WithAuth(r.Authenticator())); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s as %s: %w", binary, target, err)
	}
	d, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push %s as %s: %w", binary, target, err)
	}
	return d, nil
}

// binaryImage is the image PushBinary pushes.
func binaryImage(binary string, opts ImageOptions) (v1.Image, error) {
	fi, err := os.Stat(binary)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", binary)
	}
	p := opts.Path
	if p == "" {
		p = "/" + filepath.Base(binary)
	}
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return nil, fmt.Errorf("path in the image %q: want a clean absolute file path", p)
	}
	entrypoint := opts.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = []string{p}
	}
	user := opts.User
	if user == "" {
		user = NonRootUser
	}
	created := opts.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC().Truncate(time.Second)
	var xattrs map[string]string
	if len(opts.Capabilities) > 0 {
		v, err := capabilityXattr(opts.Capabilities)
		if err != nil {
			return nil, err
		}
		// What containerd sets on the unpacked file (a PAX record of the
		// layer's tar, as tar --xattrs writes it).
		xattrs = map[string]string{"SCHILY.xattr.security.capability": v}
	}

	// The layer is written again from the binary whenever it is read
	// (digest, then upload): no copy of a 100 MB binary on disk or in memory.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeLayer(pw, binary, fi.Size(), p, created, xattrs)) }()
		return pr, nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "hybrid-ccm test/registry: " + p,
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: entrypoint,
		Cmd:        opts.Cmd,
		Env:        opts.Env,
		User:       user,
		WorkingDir: "/",
	}
	return mutate.ConfigFile(img, cf)
}

// writeLayer writes the uncompressed layer: the parent directories of p and
// the binary at p, owned by 0:0, modified at mtime, with the PAX records
// pax (nil: none).
func writeLayer(w io.Writer, binary string, size int64, p string, mtime time.Time, pax map[string]string) error {
	f, err := os.Open(binary)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(w)
	rel := strings.TrimPrefix(p, "/")
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		dir := strings.Join(parts[:i], "/") + "/"
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: mtime}); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o555, Size: size, ModTime: mtime, PAXRecords: pax}); err != nil {
		return err
	}
	n, err := io.Copy(tw, io.LimitReader(f, size))
	if err != nil {
		return fmt.Errorf("read %s: %w", binary, err)
	}
	if n != size {
		return fmt.Errorf("read %s: %d bytes, want %d (it changed)", binary, n, size)
	}
	return tw.Close()
}
