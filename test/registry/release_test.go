package registry

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// helmConfig is the media type of a Helm chart's OCI config.
const helmConfig types.MediaType = "application/vnd.cncf.helm.config.v1+json"

// version is what the tests release.
const version = "0.0.0-registrytest"

// release runs Release of the repository into r at version and returns
// make's output, or fails the test with it.
func release(t *testing.T, r *Registry) *bytes.Buffer {
	t.Helper()
	root, err := ship.FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	began := time.Now()
	if err := r.Release(t.Context(), root, version, &log); err != nil {
		t.Fatalf("%v\nmake output:\n%s", err, log.String())
	}
	t.Logf("make release took %s", time.Since(began).Round(time.Second))
	return &log
}

// `make release` to the registry, as a user runs it: the images and the
// charts are there afterwards, over HTTPS with the registry's CA. It builds
// the four images for this machine's platform: about 15 s on a warm Go build
// cache, several minutes on a cold one.
func TestRelease(t *testing.T) {
	r := start(t)
	log := release(t, r)

	get := func(s string) *remote.Descriptor {
		t.Helper()
		ref, err := name.ParseReference(s, name.StrictValidation)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Get(ref, remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		return desc
	}
	// An image index (one platform here).
	image := r.Host() + "/hybrid-ccm/talos-ccm:" + version
	if mt := get(image).MediaType; mt != types.OCIImageIndex {
		t.Errorf("%s: media type %s, want %s", image, mt, types.OCIImageIndex)
	}
	// A Helm chart: a manifest whose config is Helm's.
	chart := r.Host() + "/hybrid-ccm/charts/hybrid-ccm:" + version
	m, err := get(chart).Image()
	if err != nil {
		t.Fatalf("%s: %v", chart, err)
	}
	mf, err := m.Manifest()
	if err != nil {
		t.Fatalf("%s: %v", chart, err)
	}
	if mf.Config.MediaType != helmConfig {
		t.Errorf("%s: config media type %s, want %s", chart, mf.Config.MediaType, helmConfig)
	}
	// Unsigned (no SIGNING_KEY), which the output says: no signature tag.
	desc := get(image)
	sig := r.Host() + "/hybrid-ccm/talos-ccm:" + desc.Digest.Algorithm + "-" + desc.Digest.Hex + ".sig"
	ref, err := name.ParseReference(sig, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Head(ref, remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport)); statusOf(err) != http.StatusNotFound {
		t.Errorf("%s after a release without a signing key: %v, want 404", sig, err)
	}
	for _, want := range []string{"pushed oci://" + r.Host() + "/hybrid-ccm/charts/hybrid-ccm", "pushed " + r.Host() + "/hybrid-ccm/talos-ccm:" + version,
		"no signing key", "will not be signed"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("make output lacks %q", want)
		}
	}
}

// A failing make: the error says what ran and ends with its output.
func TestReleaseMakeFails(t *testing.T) {
	r := start(t)
	err := r.Release(t.Context(), t.TempDir(), "0.0.0-x", nil)
	if err == nil {
		t.Fatal("release in a directory without a Makefile succeeded")
	}
	for _, want := range []string{"make release REGISTRY=" + r.Host() + "/hybrid-ccm VERSION=0.0.0-x", "No rule to make target"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if err := r.Release(t.Context(), t.TempDir(), "", nil); err == nil {
		t.Error("release without a version succeeded")
	}
}

// An SSL_CERT_FILE already set is kept: make gets it and the registry's CA.
func TestReleaseCAFile(t *testing.T) {
	r := start(t)
	t.Setenv("SSL_CERT_FILE", "")
	if got, err := r.releaseCAFile(); err != nil || got != r.CAFile() {
		t.Errorf("without SSL_CERT_FILE: %s, %v; want %s", got, err, r.CAFile())
	}
	other := filepath.Join(t.TempDir(), "other.pem")
	if err := os.WriteFile(other, []byte("-----BEGIN CERTIFICATE-----\nb3RoZXI=\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", other)
	got, err := r.releaseCAFile()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := os.ReadFile(r.CAFile())
	if !bytes.Contains(data, []byte("b3RoZXI=")) || !bytes.Contains(data, ca) {
		t.Errorf("%s lacks the certificates of %s or of %s:\n%s", got, other, r.CAFile(), data)
	}
}

// `make release` to a registry whose release repositories are private, as a
// user logged in with `docker login` and `helm registry login` runs it: the
// images and the charts are pushed with the credentials, and nobody pulls
// them without.
func TestReleasePrivate(t *testing.T) {
	r := startPrivate(t)
	release(t, r)
	creds := &authn.Basic{Username: testCreds.Username, Password: testCreds.Password}
	for _, s := range []string{r.Host() + "/hybrid-ccm/ccm-gate:" + version, r.Host() + "/hybrid-ccm/charts/ccm-coordinator:" + version} {
		ref, err := name.ParseReference(s, name.StrictValidation)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := remote.Head(ref, remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport)); statusOf(err) != http.StatusUnauthorized {
			t.Errorf("anonymous %s: %v, want 401", s, err)
		}
		if _, err := remote.Head(ref, remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport), remote.WithAuth(creds)); err != nil {
			t.Errorf("%s with the credentials: %v", s, err)
		}
	}
}
