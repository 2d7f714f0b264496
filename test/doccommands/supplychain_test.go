package doccommands

import (
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/publish"
)

// keyPairGenerated: cosign.key (cosign's encrypted format) and cosign.pub in
// the working directory.
func keyPairGenerated(t *testing.T, w *world, _, out string) {
	for file, typ := range map[string]string{"cosign.key": "ENCRYPTED SIGSTORE PRIVATE KEY", "cosign.pub": "PUBLIC KEY"} {
		data, err := os.ReadFile(filepath.Join(w.work, file))
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if b, _ := pem.Decode(data); b == nil || b.Type != typ {
			t.Errorf("%s is not a PEM %s", file, typ)
		}
	}
}

// releasedSigned: the release is there (released), and every image index
// and chart has its signature tag.
func releasedSigned(t *testing.T, w *world, line, out string) {
	released(t, w, line, out)
	var reg, version string
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "REGISTRY="); ok {
			reg = v
		}
		if v, ok := strings.CutPrefix(f, "VERSION="); ok {
			version = v
		}
	}
	var refs []string
	for _, img := range ship.Images {
		refs = append(refs, ship.ImageRef(reg, img, version))
	}
	for _, ch := range ship.Charts {
		refs = append(refs, ship.ChartRef(reg, ch, version))
	}
	for _, s := range refs {
		ref, err := name.ParseReference(s)
		if err != nil {
			t.Fatal(err)
		}
		d, err := remote.Head(ref, w.remote())
		if err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		if _, err := remote.Head(publish.SignatureTag(ref.Context(), d.Digest), w.remote()); err != nil {
			t.Errorf("%s: no signature: %v", s, err)
		}
	}
}

// cosignVerified: cosign says the signature verified against the key.
func cosignVerified(t *testing.T, _ *world, line, out string) {
	if !strings.Contains(out, "The signatures were verified against the specified public key") {
		t.Errorf("$ %s\n%s\nsays nothing of the public key", line, out)
	}
}

// sbomDownloaded: talos-ccm.spdx.json is the SPDX 2.3 document of the
// talos-ccm binary, listing this module.
func sbomDownloaded(t *testing.T, w *world, line, out string) {
	data, err := os.ReadFile(filepath.Join(w.work, "talos-ccm.spdx.json"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var doc struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			Name string `json:"name"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("$ %s: %v\n%.300s", line, err, data)
	}
	names := map[string]bool{}
	for _, p := range doc.Packages {
		names[p.Name] = true
	}
	if doc.SPDXVersion != "SPDX-2.3" || !names["talos-ccm"] || !names["github.com/hybrid-ccm/hybrid-ccm"] || !names["k8s.io/cloud-provider"] {
		t.Errorf("$ %s: %s with packages %v", line, doc.SPDXVersion, names)
	}
}
