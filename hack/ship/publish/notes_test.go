package publish

import (
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

func TestChangelogSection(t *testing.T) {
	const changelog = "# Changelog\n\nintro\n\n## Unreleased\n\n- next\n\n## 0.2.0 - 2026-12-01\n\n- two\n- lines\n\n## v0.1.0\n\n- first\n"
	for _, tc := range []struct{ version, body, heading string }{
		{"0.2.0", "- two\n- lines", "0.2.0 - 2026-12-01"},
		{"0.1.0", "- first", "v0.1.0"},
		{"0.3.0", "- next", "Unreleased"},
		{"0.2", "- next", "Unreleased"}, // a prefix of 0.2.0 is not 0.2.0
	} {
		if body, heading := ChangelogSection([]byte(changelog), tc.version); body != tc.body || heading != tc.heading {
			t.Errorf("%s: %q under %q, want %q under %q", tc.version, body, heading, tc.body, tc.heading)
		}
	}
	if body, heading := ChangelogSection([]byte("# Changelog\n\n## 0.1.0\n\n- first\n"), "0.2.0"); body != "" || heading != "" {
		t.Errorf("no section: %q %q", body, heading)
	}
}

func TestReleaseNotes(t *testing.T) {
	o := ship.Options{Registry: "registry.example.com/hybrid-ccm", Version: "0.2.0"}
	h := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	r := &Released{
		Images: map[string]v1.Hash{"registry.example.com/hybrid-ccm/talos-ccm:0.2.0": h},
		Charts: map[string]string{"registry.example.com/hybrid-ccm/charts/hybrid-ccm:0.2.0": "sha256:" + strings.Repeat("cd", 32)},
		SBOMs:  map[string]map[string]v1.Hash{"registry.example.com/hybrid-ccm/talos-ccm:0.2.0": {"linux/arm64": {Algorithm: "sha256", Hex: strings.Repeat("ef", 32)}}},
	}
	notes := string(ReleaseNotes(o, []byte("## Unreleased\n\n- adoption of static manifests\n"), r))
	for _, want := range []string{
		"# Hybrid CCM 0.2.0", "- adoption of static manifests", `its "Unreleased" section`,
		"| `registry.example.com/hybrid-ccm/talos-ccm:0.2.0` | `sha256:abab", "oci://registry.example.com/hybrid-ccm/charts/hybrid-ccm:0.2.0",
		"helm install hybrid-ccm oci://registry.example.com/hybrid-ccm/charts/hybrid-ccm --version 0.2.0 --namespace kube-system",
		"| `registry.example.com/hybrid-ccm/talos-ccm:0.2.0` | linux/arm64 | `sha256:efef",
		"Not signed: the release was made without a signing key.",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("release notes lack %q:\n%s", want, notes)
		}
	}
	// Signed: the notes hold the public key and the command that verifies.
	r.Signatures = map[string]string{"registry.example.com/hybrid-ccm/talos-ccm:0.2.0": "registry.example.com/hybrid-ccm/talos-ccm:sha256-abab.sig"}
	r.PublicKey = []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
	notes = string(ReleaseNotes(o, nil, r))
	for _, want := range []string{"-----BEGIN PUBLIC KEY-----\nAAAA", "cosign verify --key cosign.pub --insecure-ignore-tlog=true registry.example.com/hybrid-ccm/talos-ccm:0.2.0"} {
		if !strings.Contains(notes, want) || strings.Contains(notes, "Not signed") {
			t.Errorf("signed release notes lack %q or say not signed:\n%s", want, notes)
		}
	}
}
