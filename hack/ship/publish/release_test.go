package publish

import (
	"bytes"
	"context"
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

	rel, err := Release(ctx, ReleaseOptions{
		Options:    ship.Options{Root: testenv.RepoRoot(), Registry: reg, Version: version, Platforms: shiptest.Platforms(), Out: t.TempDir(), Log: shiptest.Log{T: t}},
		HTTPClient: srv.Client(),
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
