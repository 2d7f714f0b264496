package registry

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"debug/buildinfo"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/publish"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/shiptest"
)

// cosign is the cosign CLI hack/cosign.sh builds (`make cosign`). The test
// skips, saying so, when it is not built: make test does not build it (a cold
// build is minutes of CI's budget), and hack/ship/publish's TestRelease checks
// the same signatures in cosign's format without it.
func cosign(t *testing.T) string {
	t.Helper()
	root, err := ship.FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "hack", "cosign.sh"), "--cached")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		t.Skipf("the real cosign is not here (%s); TestRelease in hack/ship/publish checks the signatures in cosign's format", strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		t.Fatalf("hack/cosign.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// cosignRun runs cosign with the registry's CA trusted, straight to it, in a
// home of its own (no state of the user's, nothing fetched from elsewhere).
func cosignRun(t *testing.T, bin string, r *Registry, dir string, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Dir = dir
	host, _, _ := net.SplitHostPort(r.Host())
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+r.CAFile(), "HOME="+dir, "TUF_ROOT="+filepath.Join(dir, "tuf"),
		"NO_PROXY="+host, "no_proxy="+host, "DOCKER_CONFIG="+filepath.Join(dir, "docker"))
	cmd.Env = append(cmd.Env, env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// verify runs `cosign verify` of ref with the public key (no transparency
// log: a key of the user's, as docs/supply-chain.md verifies).
func verify(t *testing.T, bin string, r *Registry, dir, pub, ref string) (stdout, stderr string, err error) {
	t.Helper()
	return cosignRun(t, bin, r, dir, nil, "verify", "--key", pub, "--insecure-ignore-tlog=true", "--output", "json", ref)
}

// lastLine is the last non-empty line of s: what cosign's error says.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// signedDigests are the repository@digest the signatures cosign verified
// name.
func signedDigests(t *testing.T, stdout string) []string {
	t.Helper()
	var sigs []struct {
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
	if err := json.Unmarshal([]byte(strings.TrimSpace(stdout)), &sigs); err != nil {
		t.Fatalf("cosign verify output: %v\n%s", err, stdout)
	}
	var out []string
	for _, s := range sigs {
		out = append(out, s.Critical.Identity.DockerReference+"@"+s.Critical.Image.DockerManifestDigest)
	}
	return out
}

// `make release SIGNING_KEY=cosign.key` with a key cosign generated
// (cosign's encrypted format, COSIGN_PASSWORD): cosign verifies every image
// and chart with the public key; another key, an image put in place of a
// signed one and a signature moved onto another payload are refused. Every
// image of every platform has its SPDX SBOM attached, found through the
// referrers API and by `cosign download sbom`, listing the modules of the
// image's binary.
func TestReleaseSignedAndSBOM(t *testing.T) {
	bin := cosign(t)
	r := start(t)
	dir := t.TempDir()
	const password = "release-test"
	if _, e, err := cosignRun(t, bin, r, dir, []string{"COSIGN_PASSWORD=" + password}, "generate-key-pair"); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, e)
	}
	key, pub := filepath.Join(dir, "cosign.key"), filepath.Join(dir, "cosign.pub")
	t.Setenv(publish.SigningPasswordEnv, password)
	root, err := ship.FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	if err := r.ReleaseSigned(t.Context(), root, version, key, &log); err != nil {
		t.Fatalf("%v\nmake output:\n%s", err, log.String())
	}
	ropts := []remote.Option{remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport)}
	digestOf := func(s string) (name.Reference, v1.Hash) {
		t.Helper()
		ref, err := name.ParseReference(s, name.StrictValidation)
		if err != nil {
			t.Fatal(err)
		}
		d, err := remote.Head(ref, ropts...)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		return ref, d.Digest
	}

	// Signatures.
	var refs []string
	for _, img := range ship.Images {
		refs = append(refs, ship.ImageRef(r.ReleaseRegistry(), img, version))
	}
	for _, ch := range ship.Charts {
		refs = append(refs, ship.ChartRef(r.ReleaseRegistry(), ch, version))
	}
	for _, s := range refs {
		ref, d := digestOf(s)
		out, e, err := verify(t, bin, r, dir, pub, s)
		if err != nil {
			t.Errorf("cosign verify %s: %v\n%s", s, err, e)
			continue
		}
		if got, want := signedDigests(t, out), ref.Context().Name()+"@"+d.String(); len(got) != 1 || got[0] != want {
			t.Errorf("cosign verify %s: signatures of %v, want %s", s, got, want)
		}
		if !strings.Contains(log.String(), "signed ") || !strings.Contains(log.String(), publish.SignatureTag(ref.Context(), d).String()) {
			t.Errorf("make output does not say %s was signed", s)
		}
	}

	// Another key.
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&otherKey.PublicKey)
	other := filepath.Join(dir, "other.pub")
	if err := os.WriteFile(other, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{refs[0], ship.ChartRef(r.ReleaseRegistry(), "hybrid-ccm", version)} {
		if _, e, err := verify(t, bin, r, dir, other, s); err == nil {
			t.Errorf("cosign verify %s with another key succeeded", s)
		} else {
			t.Logf("cosign verify %s with another key: %v: %s", s, err, lastLine(e))
		}
	}

	// SBOMs, before the tampering below replaces an image.
	for _, img := range ship.Images {
		checkSBOMs(t, bin, r, dir, ship.ImageRef(r.ReleaseRegistry(), img, version), img, ropts)
	}

	// A signature moved onto a payload naming another digest: the payload
	// of the ccm-gate index's signature edited to name the hybridctl index
	// (pushed into ccm-gate's repository), its signature kept.
	gateRef, gate := digestOf(ship.ImageRef(r.ReleaseRegistry(), "ccm-gate", version))
	_, ctlDigest := digestOf(ship.ImageRef(r.ReleaseRegistry(), "hybridctl", version))
	sigImg, err := remote.Image(publish.SignatureTag(gateRef.Context(), gate), ropts...)
	if err != nil {
		t.Fatal(err)
	}
	mf, err := sigImg.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(mf.Layers) != 1 || mf.Layers[0].MediaType != publish.SimpleSigningMediaType || mf.Layers[0].Annotations[publish.SignatureAnnotation] == "" {
		t.Fatalf("signature manifest of %s: %+v", gateRef, mf)
	}
	forged, err := publish.SimpleSigningPayload(gateRef.Context().Name(), ctlDigest.String())
	if err != nil {
		t.Fatal(err)
	}
	m, blobs, err := publish.SignatureManifest(forged, mf.Layers[0].Annotations[publish.SignatureAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	ctlRef, _ := name.ParseReference(ship.ImageRef(r.ReleaseRegistry(), "hybridctl", version))
	ctlIdx, err := remote.Index(ctlRef, ropts...)
	if err != nil {
		t.Fatal(err)
	}
	tampered := gateRef.Context().Tag(version)
	if err := remote.WriteIndex(tampered, ctlIdx, ropts...); err != nil {
		t.Fatal(err)
	}
	// Without a signature for the index now tagged: refused.
	if out, e, err := verify(t, bin, r, dir, pub, tampered.String()); err == nil {
		t.Errorf("cosign verify of %s, now another image, succeeded:\n%s", tampered, out)
	} else {
		t.Logf("cosign verify of %s, now another image: %v: %s", tampered, err, lastLine(e))
	}
	if _, err := publish.PushManifest(gateRef.Context(), publish.SignatureTag(gateRef.Context(), ctlDigest), m, blobs, ropts); err != nil {
		t.Fatal(err)
	}
	// With the moved signature: refused as well.
	if out, e, err := verify(t, bin, r, dir, pub, tampered.String()); err == nil {
		t.Errorf("cosign verify of %s with a signature of another payload succeeded:\n%s", tampered, out)
	} else {
		t.Logf("cosign verify of %s with a moved signature: %v: %s", tampered, err, lastLine(e))
	}
}

// checkSBOMs requires one SPDX SBOM per platform image of ref, found through
// the referrers API (artifactType filter) and with `cosign download sbom`,
// listing the Go toolchain and every module of the image's binary.
func checkSBOMs(t *testing.T, bin string, r *Registry, dir, s, image string, ropts []remote.Option) {
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
	if len(im.Manifests) == 0 {
		t.Fatalf("%s has no platform images", s)
	}
	for _, desc := range im.Manifests {
		platform := desc.Platform.OS + "/" + desc.Platform.Architecture
		subject := ref.Context().Digest(desc.Digest.String())
		refs, err := remote.Referrers(subject, append(ropts, remote.WithFilter("artifactType", publish.SPDXMediaType))...)
		if err != nil {
			t.Fatalf("referrers of %s: %v", subject, err)
		}
		rm, err := refs.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(rm.Manifests) != 1 || rm.Manifests[0].ArtifactType != publish.SPDXMediaType {
			t.Errorf("%s for %s: referrers %+v, want one %s", s, platform, rm.Manifests, publish.SPDXMediaType)
			continue
		}
		sbomImg, err := remote.Image(ref.Context().Digest(rm.Manifests[0].Digest.String()), ropts...)
		if err != nil {
			t.Fatal(err)
		}
		layers, err := sbomImg.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("SBOM of %s for %s: %d layers, %v", s, platform, len(layers), err)
		}
		rc, err := layers[0].Compressed()
		if err != nil {
			t.Fatal(err)
		}
		doc, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		binary := shiptest.ExtractBinary(t, img, image)
		checkSBOMLists(t, s+" "+platform, doc, binary)

		// cosign finds the same document (its tag scheme: sha256-<hex>.sbom).
		if platform == "linux/"+runtime.GOARCH {
			out, e, err := cosignRun(t, bin, r, dir, nil, "download", "sbom", "--platform", platform, s)
			if err != nil {
				t.Errorf("cosign download sbom %s: %v\n%s", s, err, e)
			} else if out != string(doc) {
				t.Errorf("cosign download sbom --platform %s %s: another document than the referrer's:\n%.400s", platform, s, out)
			}
		}
	}
}

// checkSBOMLists requires the SPDX document to list every module of the
// binary's build information at its version, and its Go version.
func checkSBOMLists(t *testing.T, what string, doc []byte, binary string) {
	t.Helper()
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	var d struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			Name        string `json:"name"`
			VersionInfo string `json:"versionInfo"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatalf("%s: SBOM: %v", what, err)
	}
	if d.SPDXVersion != "SPDX-2.3" {
		t.Errorf("%s: spdxVersion %q", what, d.SPDXVersion)
	}
	listed := map[string]bool{}
	for _, p := range d.Packages {
		listed[p.Name+" "+p.VersionInfo] = true
	}
	want := []string{"stdlib " + bi.GoVersion}
	for _, m := range bi.Deps {
		if m.Replace != nil {
			m = m.Replace
		}
		want = append(want, m.Path+" "+m.Version)
	}
	if len(bi.Deps) < 10 {
		t.Errorf("%s: the binary records only %d modules", what, len(bi.Deps))
	}
	for _, w := range want {
		if !listed[w] {
			t.Errorf("%s: SBOM lacks %s", what, w)
		}
	}
}

// A key file that is no key stops `make release` before anything is
// pushed, naming the file.
func TestReleaseBadSigningKey(t *testing.T) {
	r := start(t)
	root, err := ship.FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "cosign.key")
	if err := os.WriteFile(bad, []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = r.ReleaseSigned(t.Context(), root, version, bad, nil)
	if err == nil {
		t.Fatal("release with a public key as the signing key succeeded")
	}
	if want := fmt.Sprintf("signing key %s: PEM block \"PUBLIC KEY\" is not a private key", bad); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q lacks %q", err, want)
	}
	reg, err := name.NewRegistry(r.Host())
	if err != nil {
		t.Fatal(err)
	}
	repos, err := remote.Catalog(t.Context(), reg, remote.WithTransport(r.HTTPClient().Transport))
	if err != nil {
		t.Fatal(err)
	}
	if len(repos) != 0 {
		t.Errorf("the registry has %v after a release that failed", repos)
	}
}
