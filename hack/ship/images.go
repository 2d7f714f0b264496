package ship

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// Annotation and label keys of the OCI image spec.
const (
	AnnotationRefName  = "org.opencontainers.image.ref.name"
	AnnotationSource   = "org.opencontainers.image.source"
	AnnotationRevision = "org.opencontainers.image.revision"
	AnnotationVersion  = "org.opencontainers.image.version"
	AnnotationCreated  = "org.opencontainers.image.created"
	AnnotationTitle    = "org.opencontainers.image.title"
	AnnotationLicenses = "org.opencontainers.image.licenses"
)

// User is the numeric user and group every image runs as (no /etc/passwd
// needed; Kubernetes' runAsNonRoot accepts it).
const User = "65532:65532"

// Options choose what Build builds.
type Options struct {
	// Root is the repository root. Empty: FindRoot.
	Root string
	// Registry the references are under. Empty: DefaultRegistry.
	Registry string
	// Version is the tag and org.opencontainers.image.version. Empty:
	// DefaultVersion.
	Version string
	// Platforms as os/arch. Empty: DefaultPlatforms.
	Platforms []string
	// Images to build, names from Images. Empty: all of them.
	Images []string
	// Out is the OCI image layout directory to write; what was there before
	// is removed.
	Out string
	// Go is the go command. Empty: "go".
	Go string
	// Log receives progress lines. Nil: none.
	Log io.Writer

	layoutLocked bool // the caller holds LockLayout(Out) (BuildLocked)
}

// WithDefaults fills the empty fields of o.
func (o Options) WithDefaults() (Options, error) {
	var err error
	if o.Root == "" {
		if o.Root, err = FindRoot(); err != nil {
			return o, err
		}
	}
	if o.Registry == "" {
		o.Registry = DefaultRegistry
	}
	o.Registry = strings.TrimSuffix(o.Registry, "/")
	if o.Version == "" {
		if o.Version, err = DefaultVersion(o.Root); err != nil {
			return o, err
		}
	}
	if len(o.Platforms) == 0 {
		o.Platforms = DefaultPlatforms
	}
	if len(o.Images) == 0 {
		o.Images = Images
	}
	for _, name := range o.Images {
		if !slices.Contains(Images, name) {
			return o, fmt.Errorf("unknown image %q (known: %s)", name, strings.Join(Images, ", "))
		}
	}
	if o.Go == "" {
		o.Go = "go"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Out == "" {
		return o, fmt.Errorf("no output directory")
	}
	return o, nil
}

// Build compiles the images' commands for every platform and writes an OCI
// image layout to opts.Out: index.json holds one image index per image (one
// manifest per platform), annotated org.opencontainers.image.ref.name with
// its full reference. It returns reference → digest of the image index.
//
// Each image is one layer on an empty base: the static binary at /<name>
// (CGO disabled, -trimpath, no build ID or VCS stamp, stripped), mode 0555,
// owned by 0:0; config Entrypoint ["/<name>"], User 65532:65532, WorkingDir /.
// Every timestamp is the commit time of HEAD, so two builds of one commit with
// one Go toolchain give the same digests.
func Build(ctx context.Context, opts Options) (map[string]v1.Hash, error) {
	opts.layoutLocked = false
	return build(ctx, opts)
}

// BuildLocked is Build for a caller holding LockLayout(opts.Out).
func BuildLocked(ctx context.Context, opts Options) (map[string]v1.Hash, error) {
	opts.layoutLocked = true
	return build(ctx, opts)
}

func build(ctx context.Context, opts Options) (map[string]v1.Hash, error) {
	o, err := opts.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	src, err := sourceCommit(o.Root)
	if err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	work, err := os.MkdirTemp("", "hybrid-ccm-images-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	// platform -> image -> image manifest
	built := map[string]map[string]v1.Image{}
	for _, platform := range o.Platforms {
		osName, arch, ok := strings.Cut(platform, "/")
		if !ok || osName != "linux" || arch == "" {
			return nil, fmt.Errorf("build images: platform %q: want linux/<arch>", platform)
		}
		bin := filepath.Join(work, osName+"_"+arch)
		start := time.Now()
		if err := goBuild(ctx, o, osName, arch, bin); err != nil {
			return nil, fmt.Errorf("build images for %s: %w", platform, err)
		}
		fmt.Fprintf(o.Log, "built %s for %s in %s\n", strings.Join(o.Images, ", "), platform, time.Since(start).Round(time.Millisecond))
		built[platform] = map[string]v1.Image{}
		for _, name := range o.Images {
			img, err := image(o, src, name, osName, arch, filepath.Join(bin, name))
			if err != nil {
				return nil, fmt.Errorf("build image %s for %s: %w", name, platform, err)
			}
			built[platform][name] = img
		}
	}

	if !o.layoutLocked {
		unlock, err := LockLayout(ctx, o.Out, o.Log)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	if err := os.RemoveAll(o.Out); err != nil {
		return nil, err
	}
	lp, err := layout.Write(o.Out, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", o.Out, err)
	}
	refs := map[string]v1.Hash{}
	for _, name := range o.Images {
		ref := ImageRef(o.Registry, name, o.Version)
		var adds []mutate.IndexAddendum
		for _, platform := range o.Platforms {
			osName, arch, _ := strings.Cut(platform, "/")
			adds = append(adds, mutate.IndexAddendum{
				Add:        built[platform][name],
				Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: osName, Architecture: arch}},
			})
		}
		idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		idx = mutate.AppendManifests(idx, adds...)
		idx = mutate.Annotations(idx, annotations(o, src, name)).(v1.ImageIndex)
		if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{AnnotationRefName: ref})); err != nil {
			return nil, fmt.Errorf("write %s to %s: %w", ref, o.Out, err)
		}
		d, err := idx.Digest()
		if err != nil {
			return nil, err
		}
		refs[ref] = d
		fmt.Fprintf(o.Log, "%s@%s\n", ref, d)
	}
	return refs, nil
}

// ReleaseTags are the build tags of the images' binaries.
const ReleaseTags = "nodemo"

// goBuild compiles every image's command for one platform into dir, in one go
// invocation (the packages they share are compiled once).
func goBuild(ctx context.Context, o Options, osName, arch, dir string) error {
	pkgs := make([]string, 0, len(o.Images))
	for _, name := range o.Images {
		pkgs = append(pkgs, "./cmd/"+name)
	}
	cmd := buildCommand(ctx, o.Go, osName, arch, dir+string(filepath.Separator),
		[]string{"-X", GateImageSymbol + "=" + ImageRef(o.Registry, "ccm-gate", o.Version), "-X", VersionSymbol + "=" + o.Version}, pkgs)
	cmd.Dir = o.Root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, out.String())
	}
	return nil
}

// buildCommand is the go build of pkgs into out (a file, or a directory when
// it ends in a separator) for osName/arch with the flags and environment of
// the release images, and the -X settings in x.
func buildCommand(ctx context.Context, goBin, osName, arch, out string, x, pkgs []string) *exec.Cmd {
	ldflags := append([]string{"-s", "-w", "-buildid="}, x...)
	// nodemo: hybridctl without the demo, which links a control-plane
	// starter that needs a writable cache directory at start-up.
	args := []string{"build", "-trimpath", "-buildvcs=false", "-tags=" + ReleaseTags, "-ldflags=" + strings.Join(ldflags, " "), "-o", out}
	cmd := exec.CommandContext(ctx, goBin, append(args, pkgs...)...)
	// Everything that changes the machine code is fixed here, not taken from
	// the caller's environment.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+osName, "GOARCH="+arch,
		"GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=-mod=readonly", "GOEXPERIMENT=")
	return cmd
}

// HostBuild is the go build, run in root, of the package pkg into the file
// out for this machine, compiled as the release images compile their
// commands: static (CGO_ENABLED=0, internal linking), stripped, -trimpath,
// the release tags. Benchmarks measure such binaries, not a development
// build: a cgo build of ccm-coordinator holds some 20 MiB more of its
// executable resident.
func HostBuild(ctx context.Context, root, out, pkg string) *exec.Cmd {
	cmd := buildCommand(ctx, "go", runtime.GOOS, runtime.GOARCH, out, nil, []string{pkg})
	cmd.Dir = root
	return cmd
}

// annotations are the OCI annotations of manifests and indexes, and the
// labels of image configs.
func annotations(o Options, src commit, name string) map[string]string {
	a := map[string]string{
		AnnotationSource:   Source,
		AnnotationVersion:  o.Version,
		AnnotationCreated:  src.time.Format(time.RFC3339),
		AnnotationTitle:    name,
		AnnotationLicenses: License,
	}
	if src.revision != "" {
		a[AnnotationRevision] = src.revision
	}
	return a
}

// image is the image of one command for one platform.
func image(o Options, src commit, name, osName, arch, binary string) (v1.Image, error) {
	layerFile := binary + ".tar"
	if err := writeLayerTar(layerFile, name, binary, src.time); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromFile(layerFile, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: src.time},
			CreatedBy: "hack/ship: go build ./cmd/" + name,
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
	cf.OS, cf.Architecture = osName, arch
	cf.Created = v1.Time{Time: src.time}
	cf.Config = v1.Config{
		Entrypoint: []string{"/" + name},
		User:       User,
		WorkingDir: "/",
		Labels:     annotations(o, src, name),
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return mutate.Annotations(img, annotations(o, src, name)).(v1.Image), nil
}

// writeLayerTar writes the layer of an image: the binary as /<name>, root's,
// read and execute for everyone, modified at mtime. Nothing else (no shell,
// no directories, no passwd).
func writeLayerTar(path, name, binary string, mtime time.Time) error {
	data, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     0o555,
		Size:     int64(len(data)),
		ModTime:  mtime,
		Format:   tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		f.Close()
		return err
	}
	if _, err := tw.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// LockLayout takes an exclusive lock on the layout dir (the file dir+".lock"
// beside it), waiting while another build holds it: two builds writing one
// layout at once (two `make release` in one checkout) would remove each
// other's blobs half-written. The lock goes with the process, so a killed
// build leaves none behind. Build takes it; BuildLocked is for a caller that
// holds it already (a release reads the layout after building it).
func LockLayout(ctx context.Context, dir string, log io.Writer) (func(), error) {
	name := filepath.Clean(dir) + ".lock"
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	fd := int(f.Fd())
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err == nil {
		return func() { f.Close() }, nil
	} else if !errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return nil, fmt.Errorf("lock %s (%s): %w", dir, name, err)
	}
	if log == nil {
		log = io.Discard
	}
	fmt.Fprintf(log, "waiting for another build writing %s to finish (it holds %s)\n", dir, name)
	for {
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", dir, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s (%s): %w", dir, name, err)
		}
	}
}
