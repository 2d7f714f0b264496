package publish

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
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
	// Signer signs every image index and chart pushed (cosign's format,
	// signatures pushed with Docker's credentials). Nil: nothing is signed,
	// which the log and the release notes say.
	Signer *Signer
}

// Released is what a release pushed: reference → digest of the image index
// or chart manifest. Chart references have no oci:// scheme.
type Released struct {
	Images map[string]v1.Hash
	Charts map[string]string
	// SBOMs are, by image reference and platform, the digests of the SBOM
	// artifacts attached to the platform's image manifest.
	SBOMs map[string]map[string]v1.Hash
	// Signatures are, by image or chart reference, the tags holding their
	// signatures (sha256-<hex>.sig); empty without a signer.
	Signatures map[string]string
	// SignedWith is the signing key's file; empty: nothing was signed.
	SignedWith string
	// PublicKey is the signing key's public half (PEM), what users verify
	// with; empty without a signer.
	PublicKey []byte
	// Notes is the release notes file it wrote (ReleaseNotes).
	Notes string
}

// Release builds the images (ship.Build), pushes them, then pushes every chart of
// ship.Charts as ReleaseCharts makes it, with Helm's registry client (what `helm
// push` does) to oci://<registry>/charts. ship.Images go first: a chart in the
// registry never names an image that is not there. Every platform image gets an
// SBOM attached (attachSBOMs); with opts.Signer every image index and chart
// manifest is signed (cosign's format, sign).
func Release(ctx context.Context, opts ReleaseOptions) (*Released, error) {
	o, err := opts.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if len(opts.Images) != 0 && len(opts.Images) != len(ship.Images) {
		return nil, fmt.Errorf("release: the charts name every image; build all of them")
	}
	out := &Released{Images: map[string]v1.Hash{}, Charts: map[string]string{},
		SBOMs: map[string]map[string]v1.Hash{}, Signatures: map[string]string{}}
	if opts.Signer != nil {
		out.SignedWith = opts.Signer.File
		if out.PublicKey, err = opts.Signer.PublicKeyPEM(); err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
	} else {
		fmt.Fprintf(o.Log, "no signing key (--signing-key, make release %s=...): the images and charts will not be signed\n", SigningKeyEnv)
	}
	// The layout is read back by pushImages: held until the release is done.
	unlock, err := ship.LockLayout(ctx, o.Out, o.Log)
	if err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	defer unlock()
	if _, err := ship.BuildLocked(ctx, o); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	ropts := remoteOptions(ctx, opts.HTTPClient)
	if err := pushImages(o, ropts, opts.Signer, out); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if err := pushCharts(o, opts.HTTPClient, ropts, opts.Signer, out); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	if out.Notes, err = writeNotes(o, out); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	return out, nil
}

// remoteOptions are go-containerregistry's options for the registry:
// Docker's credentials, hc's transport.
func remoteOptions(ctx context.Context, hc *http.Client) []remote.Option {
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	if hc != nil && hc.Transport != nil {
		ropts = append(ropts, remote.WithTransport(hc.Transport))
	}
	return ropts
}

// pushImages pushes every image index of the layout at o.Out to the
// reference it is annotated with, attaches the SBOMs of its images and signs
// it when there is a signer.
func pushImages(o ship.Options, ropts []remote.Option, signer *Signer, out *Released) error {
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
		sboms, err := attachSBOMs(o, ref, idx, ropts)
		if err != nil {
			return err
		}
		out.SBOMs[refName] = sboms
		for _, p := range slices.Sorted(maps.Keys(sboms)) {
			fmt.Fprintf(o.Log, "attached the SBOM of %s for %s: %s@%s\n", refName, p, ref.Context(), sboms[p])
		}
		if signer != nil {
			tag, err := sign(signer, ref.Context(), desc.Digest, ropts)
			if err != nil {
				return err
			}
			out.Signatures[refName] = tag.String()
			fmt.Fprintf(o.Log, "signed %s@%s: %s\n", refName, desc.Digest, tag)
		}
	}
	return nil
}

// pushCharts packages and pushes the release's charts, and signs their
// manifests when there is a signer.
func pushCharts(o ship.Options, hc *http.Client, ropts []remote.Option, signer *Signer, out *Released) error {
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
		if signer != nil {
			r, err := name.ParseReference(ref, name.StrictValidation)
			if err != nil {
				return err
			}
			d, err := v1.NewHash(res.Manifest.Digest)
			if err != nil {
				return fmt.Errorf("chart %s: digest %q: %w", ref, res.Manifest.Digest, err)
			}
			tag, err := sign(signer, r.Context(), d, ropts)
			if err != nil {
				return err
			}
			out.Signatures[ref] = tag.String()
			fmt.Fprintf(o.Log, "signed oci://%s@%s: %s\n", ref, d, tag)
		}
	}
	return nil
}
