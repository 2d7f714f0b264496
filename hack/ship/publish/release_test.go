package publish

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/shiptest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestRelease pushes a release to an OCI registry on loopback (go-containerregistry's
// registry behind TLS), pulls every chart back with Helm's registry client,
// renders it with its default values and requires every image it names to be
// in the registry for both architectures, at the digest the release pushed.
// The version differs from the repository's, so nothing passes by accident.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles four commands for two architectures")
	}
	t.Setenv("HELM_CONFIG_HOME", t.TempDir())
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	srv := httptest.NewTLSServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	reg := strings.TrimPrefix(srv.URL, "https://") + "/hybrid-ccm"
	const version = "1.2.3-rc.1"
	ctx := context.Background()

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := LoadSigningKey(writePEM(t, "PRIVATE KEY", pkcs8(t, key)), nil)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := Release(ctx, ReleaseOptions{
		Options:    ship.Options{Root: testenv.RepoRoot(), Registry: reg, Version: version, Platforms: shiptest.Platforms(), Out: t.TempDir(), Log: shiptest.Log{T: t}},
		HTTPClient: srv.Client(),
		Signer:     signer,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rel.Images) != len(ship.Images) || len(rel.Charts) != len(ship.Charts) {
		t.Fatalf("released %v and %v", rel.Images, rel.Charts)
	}
	// The release notes: this tree's changelog section and every reference
	// pushed.
	notes, err := os.ReadFile(rel.Notes)
	if err != nil {
		t.Fatal(err)
	}
	for ref := range rel.Images {
		if !strings.Contains(string(notes), ref) {
			t.Errorf("release notes %s lack image %s", rel.Notes, ref)
		}
	}
	if body, _ := ChangelogSection(mustRead(t, filepath.Join(testenv.RepoRoot(), Changelog)), version); body == "" || !strings.Contains(string(notes), body) {
		t.Errorf("release notes %s lack the changelog's section for %s", rel.Notes, version)
	}

	// This registry has no referrers API: the SBOMs are found through
	// their fallback tag; every image and chart is signed.
	ropts := []remote.Option{remote.WithTransport(srv.Client().Transport)}
	for ref, d := range rel.Images {
		checkSBOMReferrers(t, ref, rel.SBOMs[ref], ropts)
		checkSignature(t, ref, d.String(), &key.PublicKey, ropts)
	}
	for ref, d := range rel.Charts {
		checkSignature(t, ref, d, &key.PublicKey, ropts)
	}
	if !strings.Contains(string(notes), "cosign verify --key") || !strings.Contains(string(notes), "BEGIN PUBLIC KEY") {
		t.Errorf("release notes %s do not say how to verify the signatures", rel.Notes)
	}

	rc, err := registry.NewClient(registry.ClientOptHTTPClient(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, chartName := range ship.Charts {
		ref := ship.ChartRef(reg, chartName, version)
		pulled, err := rc.Pull(ref)
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if pulled.Manifest.Digest != rel.Charts[ref] {
			t.Errorf("%s: pulled %s, pushed %s", ref, pulled.Manifest.Digest, rel.Charts[ref])
		}
		ch, err := loader.LoadArchive(bytes.NewReader(pulled.Chart.Data))
		if err != nil {
			t.Fatal(err)
		}
		if ch.Metadata.Version != version || ch.Metadata.AppVersion != version {
			t.Errorf("%s: version %s appVersion %s", ref, ch.Metadata.Version, ch.Metadata.AppVersion)
		}
		for _, dep := range ch.Dependencies() {
			if dep.Metadata.Version != version {
				t.Errorf("%s carries %s %s", ref, dep.Name(), dep.Metadata.Version)
			}
		}
		if chartName == "hybrid-ccm" && len(ch.Dependencies()) != 2 {
			t.Errorf("%s carries %d subcharts, want talos-ccm and ccm-coordinator", ref, len(ch.Dependencies()))
		}
		images := renderedImages(t, ch)
		t.Logf("%s names %v", ref, images)
		for _, img := range images {
			named[img] = true
			checkPushedImage(t, srv, img, rel)
		}
	}
	// Between them the charts name every image (hybridctl in their helm test).
	for _, image := range ship.Images {
		if !named[ship.ImageRef(reg, image, version)] {
			t.Errorf("no chart names %s (named: %v)", ship.ImageRef(reg, image, version), named)
		}
	}

	// The pushed ccm-coordinator defaults to the pushed ccm-gate.
	ref, _ := name.ParseReference(ship.ImageRef(reg, "ccm-coordinator", version))
	idx, err := remote.Index(ref, remote.WithTransport(srv.Client().Transport))
	if err != nil {
		t.Fatal(err)
	}
	bin := shiptest.ExtractBinary(t, shiptest.PlatformImage(t, idx, ship.HostPlatform()), "ccm-coordinator")
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	if want := `"` + ship.ImageRef(reg, "ccm-gate", version) + `"`; !strings.Contains(string(out), want) {
		t.Errorf("ccm-coordinator --help does not default --gate-image to %s:\n%s", want, out)
	}
}

// checkPushedImage requires ref to be an image index in the registry, at the
// digest the release pushed, with an image for every test platform.
func checkPushedImage(t *testing.T, srv *httptest.Server, img string, rel *Released) {
	t.Helper()
	ref, err := name.ParseReference(img, name.StrictValidation)
	if err != nil {
		t.Errorf("chart names %q: %v", img, err)
		return
	}
	idx, err := remote.Index(ref, remote.WithTransport(srv.Client().Transport))
	if err != nil {
		t.Errorf("chart names %s: %v", img, err)
		return
	}
	d, err := idx.Digest()
	if err != nil || d != rel.Images[img] {
		t.Errorf("%s in the registry is %s, the release pushed %s", img, d, rel.Images[img])
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, m := range im.Manifests {
		platforms = append(platforms, m.Platform.OS+"/"+m.Platform.Architecture)
	}
	for _, p := range shiptest.Platforms() {
		if !slices.Contains(platforms, p) {
			t.Errorf("%s has no image for %s (%v)", img, p, platforms)
		}
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkSBOMReferrers requires every platform image of the index ref to have
// exactly its SBOM (sboms: by platform) among its referrers.
func checkSBOMReferrers(t *testing.T, s string, sboms map[string]v1.Hash, ropts []remote.Option) {
	t.Helper()
	ref, err := name.ParseReference(s, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref, ropts...)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(sboms) != len(im.Manifests) {
		t.Errorf("%s: SBOMs %v for %d platform images", s, sboms, len(im.Manifests))
	}
	for _, m := range im.Manifests {
		p := m.Platform.OS + "/" + m.Platform.Architecture
		refs, err := remote.Referrers(ref.Context().Digest(m.Digest.String()), ropts...)
		if err != nil {
			t.Fatalf("referrers of %s for %s: %v", s, p, err)
		}
		rm, err := refs.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(rm.Manifests) != 1 || rm.Manifests[0].Digest != sboms[p] || rm.Manifests[0].ArtifactType != SPDXMediaType {
			t.Errorf("%s for %s: referrers %+v, want the SBOM %s", s, p, rm.Manifests, sboms[p])
		}
	}
}

// checkSignature verifies the signature of digest in s's repository as
// cosign's format says: the tag sha256-<hex>.sig, a simple-signing layer
// whose annotation is the base64 ASN.1 ECDSA signature of the layer, a
// payload naming the repository and digest.
func checkSignature(t *testing.T, s, digest string, pub *ecdsa.PublicKey, ropts []remote.Option) {
	t.Helper()
	ref, err := name.ParseReference(s, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(SignatureTag(ref.Context(), h), ropts...)
	if err != nil {
		t.Errorf("%s: signature: %v", s, err)
		return
	}
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 || len(mf.Layers) != 1 || mf.Layers[0].MediaType != SimpleSigningMediaType {
		t.Fatalf("%s: signature manifest %+v (%v)", s, mf, err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	payload, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := base64.StdEncoding.DecodeString(mf.Layers[0].Annotations[SignatureAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(payload)
	if !ecdsa.VerifyASN1(pub, sum[:], sig) {
		t.Errorf("%s: signature does not verify", s)
	}
	var p struct {
		Critical struct {
			Identity struct {
				DockerReference string `json:"docker-reference"`
			} `json:"identity"`
			Image struct {
				DockerManifestDigest string `json:"docker-manifest-digest"`
			} `json:"image"`
			Type string `json:"type"`
		} `json:"critical"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		t.Fatal(err)
	}
	if p.Critical.Image.DockerManifestDigest != digest || p.Critical.Identity.DockerReference != ref.Context().Name() || p.Critical.Type != SignatureType {
		t.Errorf("%s: payload %s", s, payload)
	}
}
