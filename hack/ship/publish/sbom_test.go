package publish

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// The SBOM of a Go binary (this test's own) lists the binary with its
// SHA-256, the Go toolchain, the main module and every module its build
// information records, each with version, purl and the go.sum hash as hex
// SHA-256; the same input gives the same bytes, and so the same artifact
// manifest.
func TestSBOM(t *testing.T) {
	// A test binary records no modules: talos-ccm as its image has it, the
	// run's (test/testbin) or built here as the images build it.
	exe, ok, err := testbin.Release("talos-ccm")
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		exe = filepath.Join(t.TempDir(), "talos-ccm")
		build := ship.HostBuild(t.Context(), testenv.RepoRoot(), exe, "./cmd/talos-ccm")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", build, err, out)
		}
	}
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	if len(bi.Deps) == 0 {
		t.Fatal("the test binary records no dependencies")
	}
	in := SBOMInput{Image: "talos-ccm", Version: "1.2.3", Platform: "linux/amd64", Binary: bin,
		Created: time.Unix(1700000000, 0), Revision: "abc"}
	doc, err := SBOM(in)
	if err != nil {
		t.Fatal(err)
	}
	again, err := SBOM(in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(doc, again) {
		t.Error("two SBOMs of one input differ")
	}

	var d spdxDocument
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	if d.SPDXVersion != "SPDX-2.3" || d.DataLicense != "CC0-1.0" || d.SPDXID != "SPDXRef-DOCUMENT" || d.CreationInfo.Created != "2023-11-14T22:13:20Z" {
		t.Errorf("document header: %+v", d)
	}
	byName := map[string]spdxPackage{}
	ids := map[string]bool{}
	for _, p := range d.Packages {
		if ids[p.SPDXID] {
			t.Errorf("SPDXID %s twice", p.SPDXID)
		}
		ids[p.SPDXID] = true
		byName[p.Name] = p
	}
	sum := sha256.Sum256(bin)
	if p := byName["talos-ccm"]; len(p.Checksums) != 1 || p.Checksums[0].Value != hex.EncodeToString(sum[:]) || p.VersionInfo != "1.2.3" {
		t.Errorf("binary package %+v, want SHA256 %x", p, sum)
	}
	if p := byName["stdlib"]; p.VersionInfo != bi.GoVersion {
		t.Errorf("stdlib %q, the binary was built by %s", p.VersionInfo, bi.GoVersion)
	}
	if _, ok := byName[bi.Main.Path]; !ok {
		t.Errorf("no main module %s", bi.Main.Path)
	}
	for _, m := range bi.Deps {
		if m.Replace != nil {
			m = m.Replace
		}
		p, ok := byName[m.Path]
		if !ok {
			t.Errorf("module %s %s missing", m.Path, m.Version)
			continue
		}
		if p.VersionInfo != m.Version {
			t.Errorf("%s: version %q, want %q", m.Path, p.VersionInfo, m.Version)
		}
		if len(p.ExternalRefs) != 1 || p.ExternalRefs[0].Locator != "pkg:golang/"+m.Path+"@"+m.Version {
			t.Errorf("%s: purl %+v", m.Path, p.ExternalRefs)
		}
		if h, ok := strings.CutPrefix(m.Sum, "h1:"); ok {
			raw, _ := base64.StdEncoding.DecodeString(h)
			if len(p.Checksums) != 1 || p.Checksums[0].Value != hex.EncodeToString(raw) {
				t.Errorf("%s: checksums %+v, go.sum %s", m.Path, p.Checksums, m.Sum)
			}
		}
	}
	// Every package but the document's subject is contained in it.
	related := map[string]bool{}
	for _, r := range d.Relationships {
		related[r.Related] = true
		if !ids[r.Related] || (r.Element != "SPDXRef-DOCUMENT" && !ids[r.Element]) {
			t.Errorf("relationship %+v names an unknown element", r)
		}
	}
	for id := range ids {
		if !related[id] {
			t.Errorf("package %s is in no relationship", id)
		}
	}

	// The artifact manifest.
	subject := v1.Descriptor{MediaType: types.OCIManifestSchema1, Size: 123, Digest: v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}}
	m1, blobs, err := SBOMManifest(doc, subject, "x.spdx.json", in.Created)
	if err != nil {
		t.Fatal(err)
	}
	m2, _, err := SBOMManifest(again, subject, "x.spdx.json", in.Created)
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := json.Marshal(m1)
	r2, _ := json.Marshal(m2)
	if !bytes.Equal(r1, r2) {
		t.Error("two SBOM manifests of one input differ")
	}
	var generic map[string]any
	if err := json.Unmarshal(r1, &generic); err != nil {
		t.Fatal(err)
	}
	if generic["artifactType"] != SPDXMediaType || generic["subject"].(map[string]any)["digest"] != subject.Digest.String() {
		t.Errorf("manifest %s", r1)
	}
	if len(blobs) != 2 || !bytes.Equal(blobs[1].data, doc) || blobs[1].desc.MediaType != SPDXMediaType || blobs[0].desc.MediaType != EmptyMediaType {
		t.Errorf("blobs %+v", blobs)
	}
}

// A file that is not a Go binary has no SBOM.
func TestSBOMNotGo(t *testing.T) {
	if _, err := SBOM(SBOMInput{Image: "x", Binary: []byte("#!/bin/sh\n")}); err == nil {
		t.Error("an SBOM of a shell script")
	}
}
