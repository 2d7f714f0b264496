package publish

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/helmpath"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// ReleaseOptions choose what Release builds and where it pushes.
type ReleaseOptions struct {
	// ship.Options of the image build; Out is where the layout is written before
	// it is pushed.
	ship.Options
	// HTTPClient talks to the registry. Nil: Go's default client (system
	// roots). Credentials: Docker's config for images, Helm's registry
	// config for charts (`docker login`, `helm registry login`).
	HTTPClient *http.Client
}

// Released is what a release pushed: reference → digest of the image index
// or chart manifest. Chart references have no oci:// scheme.
type Released struct {
	Images map[string]v1.Hash
	Charts map[string]string
	// Notes is the release notes file it wrote (ReleaseNotes).
	Notes string
}

// Release builds the images (ship.Build), pushes them, then pushes every chart of
// ship.Charts as ReleaseCharts makes it, with Helm's registry client (what `helm
// push` does) to oci://<registry>/charts. ship.Images go first: a chart in the
// registry never names an image that is not there.
func Release(ctx context.Context, opts ReleaseOptions) (*Released, error) {
	o, err := opts.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if len(opts.Images) != 0 && len(opts.Images) != len(ship.Images) {
		return nil, fmt.Errorf("release: the charts name every image; build all of them")
	}
	out := &Released{Images: map[string]v1.Hash{}, Charts: map[string]string{}}
	if _, err := ship.Build(ctx, o); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if err := pushImages(ctx, o, opts.HTTPClient, out); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if err := pushCharts(o, opts.HTTPClient, out); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if out.Notes, err = writeNotes(o, out); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	return out, nil
}

// pushImages pushes every image index of the layout at o.Out to the
// reference it is annotated with.
func pushImages(ctx context.Context, o ship.Options, hc *http.Client, out *Released) error {
	lp, err := layout.FromPath(o.Out)
	if err != nil {
		return err
	}
	root, err := lp.ImageIndex()
	if err != nil {
		return err
	}
	im, err := root.IndexManifest()
	if err != nil {
		return err
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	if hc != nil && hc.Transport != nil {
		ropts = append(ropts, remote.WithTransport(hc.Transport))
	}
	for _, desc := range im.Manifests {
		refName := desc.Annotations[ship.AnnotationRefName]
		ref, err := name.ParseReference(refName, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("%s: image %s: %w", o.Out, desc.Digest, err)
		}
		idx, err := root.ImageIndex(desc.Digest)
		if err != nil {
			return err
		}
		if err := remote.WriteIndex(ref, idx, ropts...); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		out.Images[refName] = desc.Digest
		fmt.Fprintf(o.Log, "pushed %s@%s\n", refName, desc.Digest)
	}
	return nil
}

// pushCharts packages and pushes the release's charts.
func pushCharts(o ship.Options, hc *http.Client, out *Released) error {
	charts, err := ReleaseCharts(o.Root, o.Registry, o.Version)
	if err != nil {
		return err
	}
	copts := []registry.ClientOption{
		registry.ClientOptCredentialsFile(helmpath.ConfigPath(registry.CredentialsFileBasename)),
		registry.ClientOptWriter(o.Log),
	}
	if hc != nil {
		copts = append(copts, registry.ClientOptHTTPClient(hc))
	}
	rc, err := registry.NewClient(copts...)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "hybrid-ccm-charts-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, ch := range charts {
		file, err := chartutil.Save(ch, dir)
		if err != nil {
			return fmt.Errorf("package %s: %w", ch.Name(), err)
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		ref := ship.ChartRef(o.Registry, ch.Name(), o.Version)
		res, err := rc.Push(data, ref)
		if err != nil {
			return fmt.Errorf("push chart %s: %w", ref, err)
		}
		out.Charts[ref] = res.Manifest.Digest
		fmt.Fprintf(o.Log, "pushed oci://%s (%s)\n", strings.TrimSuffix(ref, ":"+o.Version), filepath.Base(file))
	}
	return nil
}
