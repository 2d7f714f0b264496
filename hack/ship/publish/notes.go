package publish

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// Changelog is the changelog at the repository's root.
const Changelog = "CHANGELOG.md"

// ChangelogSection is the body of the "## <version>" section of a changelog
// (a heading that starts with the version: "## 0.2.0 - 2026-12-01"), or of
// "## Unreleased" when the version has none yet; which one it took is the
// second result. Empty when neither exists.
func ChangelogSection(changelog []byte, version string) (body, heading string) {
	var sections [][2]string // heading, body
	for _, block := range strings.Split("\n"+string(changelog), "\n## ")[1:] {
		h, b, _ := strings.Cut(block, "\n")
		sections = append(sections, [2]string{strings.TrimSpace(h), strings.TrimSpace(b)})
	}
	for _, want := range []func(string) bool{
		func(h string) bool {
			f := strings.Fields(h)
			return len(f) > 0 && strings.TrimPrefix(f[0], "v") == version
		},
		func(h string) bool { return strings.EqualFold(h, "Unreleased") },
	} {
		if i := slices.IndexFunc(sections, func(s [2]string) bool { return want(s[0]) }); i >= 0 {
			return sections[i][1], sections[i][0]
		}
	}
	return "", ""
}

// ReleaseNotes are the notes of a release: its changelog section, what it
// pushed (references and digests) and how to install it.
func ReleaseNotes(o ship.Options, changelog []byte, r *Released) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Hybrid CCM %s\n\n", o.Version)
	switch body, heading := ChangelogSection(changelog, o.Version); {
	case body == "":
		fmt.Fprintf(&b, "%s has no section for %s and no \"Unreleased\" section.\n\n", Changelog, o.Version)
	case strings.EqualFold(heading, "Unreleased"):
		fmt.Fprintf(&b, "## Changes (%s has no section for %s yet: its \"Unreleased\" section)\n\n%s\n\n", Changelog, o.Version, body)
	default:
		fmt.Fprintf(&b, "## Changes (%s)\n\n%s\n\n", heading, body)
	}
	b.WriteString("## Images\n\n| image | index digest |\n|---|---|\n")
	for _, ref := range slices.Sorted(maps.Keys(r.Images)) {
		fmt.Fprintf(&b, "| `%s` | `%s` |\n", ref, r.Images[ref])
	}
	b.WriteString("\n## Charts\n\n| chart | manifest digest |\n|---|---|\n")
	for _, ref := range slices.Sorted(maps.Keys(r.Charts)) {
		fmt.Fprintf(&b, "| `oci://%s` | `%s` |\n", ref, r.Charts[ref])
	}
	b.WriteString("\n## SBOMs\n\nEach platform's image manifest has an SPDX 2.3 SBOM attached (OCI referrer, artifactType " + SPDXMediaType + "):\n\n| image | platform | SBOM manifest digest |\n|---|---|---|\n")
	for _, ref := range slices.Sorted(maps.Keys(r.SBOMs)) {
		for _, p := range slices.Sorted(maps.Keys(r.SBOMs[ref])) {
			fmt.Fprintf(&b, "| `%s` | %s | `%s` |\n", ref, p, r.SBOMs[ref][p])
		}
	}
	b.WriteString("\n## Signatures\n\n")
	if len(r.Signatures) == 0 {
		b.WriteString("Not signed: the release was made without a signing key.\n")
	} else {
		fmt.Fprintf(&b, "Every image index and chart above is signed (cosign's format, tag `sha256-<digest>.sig`). Verify with the public key:\n\n```text\n%s```\n\n```sh\ncosign verify --key cosign.pub --insecure-ignore-tlog=true %s\n```\n",
			r.PublicKey, ship.ImageRef(o.Registry, ship.Images[0], o.Version))
	}
	fmt.Fprintf(&b, "\n## Install\n\n```sh\nhelm install hybrid-ccm oci://%s/charts/hybrid-ccm --version %s --namespace kube-system\n```\n\nUpgrading: apply the new chart's CRDs first (docs/install.md, \"Upgrades and uninstall\").\n",
		o.Registry, o.Version)
	return b.Bytes()
}

// writeNotes writes ReleaseNotes next to the image layout
// (<dir of o.Out>/release-notes-<version>.md) and returns its path.
func writeNotes(o ship.Options, r *Released) (string, error) {
	changelog, err := os.ReadFile(filepath.Join(o.Root, Changelog))
	if err != nil && !os.IsNotExist(err) {
		return "", err
	}
	p := filepath.Join(filepath.Dir(filepath.Clean(o.Out)), "release-notes-"+o.Version+".md")
	if err := os.WriteFile(p, ReleaseNotes(o, changelog, r), 0o644); err != nil {
		return "", err
	}
	if o.Log != nil {
		fmt.Fprintf(o.Log, "wrote %s\n", p)
	}
	return p, nil
}
