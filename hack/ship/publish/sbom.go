package publish

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// SPDXMediaType is the media type of an SPDX 2.3 JSON document: the
// artifactType of the SBOM a release attaches to each image and the media
// type of its one layer.
const SPDXMediaType = "application/spdx+json"

// SBOMInput is what an SBOM describes: one image's binary for one platform.
type SBOMInput struct {
	// Image is the image's name (ship.Images), Version the release's.
	Image, Version string
	// Platform is os/arch.
	Platform string
	// Binary is the content of the image's only file, /<Image>.
	Binary []byte
	// Created is the image's creation time (the source commit's), the
	// document's creation time: the same input gives the same document.
	Created time.Time
	// Revision is the source commit (org.opencontainers.image.revision);
	// may be empty.
	Revision string
}

// spdx* are the parts of SPDX 2.3's JSON schema an SBOM uses.
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	Comment           string             `json:"comment,omitempty"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	DocumentDescribes []string           `json:"documentDescribes"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	Name             string            `json:"name"`
	SPDXID           string            `json:"SPDXID"`
	VersionInfo      string            `json:"versionInfo,omitempty"`
	Supplier         string            `json:"supplier,omitempty"`
	DownloadLocation string            `json:"downloadLocation"`
	FilesAnalyzed    bool              `json:"filesAnalyzed"`
	Checksums        []spdxChecksum    `json:"checksums,omitempty"`
	LicenseConcluded string            `json:"licenseConcluded"`
	LicenseDeclared  string            `json:"licenseDeclared"`
	CopyrightText    string            `json:"copyrightText"`
	PrimaryPurpose   string            `json:"primaryPackagePurpose,omitempty"`
	Comment          string            `json:"comment,omitempty"`
	ExternalRefs     []spdxExternalRef `json:"externalRefs,omitempty"`
	SourceInfo       string            `json:"sourceInfo,omitempty"`
	BuiltDate        string            `json:"builtDate,omitempty"`
	PackageFileName  string            `json:"packageFileName,omitempty"`
}

type spdxChecksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type spdxExternalRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// SBOM is the SPDX 2.3 JSON document of one image's binary: the binary
// itself (its SHA-256), the Go toolchain that built it, the main module and
// every module linked into it, as the binary's embedded build information
// (debug/buildinfo) records them, each with its version and go.sum hash
// (h1, SHA-256: its checksum, hex) and a purl. The image has no base: the
// binary is its only file, which the document says. The same input gives
// the same bytes (no random namespace, no wall-clock time).
func SBOM(in SBOMInput) ([]byte, error) {
	bi, err := buildinfo.Read(bytes.NewReader(in.Binary))
	if err != nil {
		return nil, fmt.Errorf("sbom of %s for %s: build info: %w", in.Image, in.Platform, err)
	}
	sum := sha256.Sum256(in.Binary)
	binSum := hex.EncodeToString(sum[:])
	created := in.Created.UTC().Format(time.RFC3339)

	var settings []string
	for _, s := range bi.Settings {
		settings = append(settings, s.Key+"="+s.Value)
	}
	binary := spdxPackage{
		Name:             in.Image,
		SPDXID:           "SPDXRef-Binary",
		VersionInfo:      in.Version,
		Supplier:         "Organization: Hybrid CCM",
		DownloadLocation: ship.Source,
		Checksums:        []spdxChecksum{{Algorithm: "SHA256", Value: binSum}},
		LicenseConcluded: "NOASSERTION",
		LicenseDeclared:  ship.License,
		CopyrightText:    "NOASSERTION",
		PrimaryPurpose:   "APPLICATION",
		PackageFileName:  "/" + in.Image,
		BuiltDate:        created,
		Comment: fmt.Sprintf("The only file of the image %s for %s (no base image: FROM scratch). Go build settings: %s",
			in.Image, in.Platform, strings.Join(settings, " ")),
		ExternalRefs: []spdxExternalRef{{Category: "PACKAGE-MANAGER", Type: "purl",
			Locator: "pkg:oci/" + in.Image + "?tag=" + in.Version + "&arch=" + strings.TrimPrefix(in.Platform, "linux/")}},
	}
	if in.Revision != "" {
		binary.SourceInfo = "built from commit " + in.Revision + " of " + ship.Source
	}
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3",
		DataLicense: "CC0-1.0",
		SPDXID:      "SPDXRef-DOCUMENT",
		Name:        in.Image + "-" + in.Version + "-" + strings.ReplaceAll(in.Platform, "/", "-"),
		// Unique per binary, yet the same for the same binary.
		DocumentNamespace: ship.Source + "/spdx/" + in.Image + "/" + in.Version + "/" + strings.ReplaceAll(in.Platform, "/", "-") + "/sha256-" + binSum,
		Comment:           "Modules from the Go build information embedded in the binary (debug/buildinfo).",
		CreationInfo:      spdxCreationInfo{Created: created, Creators: []string{"Tool: hybrid-ccm-ship", "Organization: Hybrid CCM"}},
		DocumentDescribes: []string{binary.SPDXID},
		Packages:          []spdxPackage{binary},
		Relationships:     []spdxRelationship{{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: binary.SPDXID}},
	}
	add := func(p spdxPackage, rel string) {
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, spdxRelationship{Element: binary.SPDXID, Type: rel, Related: p.SPDXID})
	}
	goVersion := strings.TrimPrefix(bi.GoVersion, "go")
	add(spdxPackage{
		Name:             "stdlib",
		SPDXID:           "SPDXRef-Go-stdlib",
		VersionInfo:      bi.GoVersion,
		DownloadLocation: "https://go.dev/dl/",
		LicenseConcluded: "NOASSERTION",
		LicenseDeclared:  "BSD-3-Clause",
		CopyrightText:    "NOASSERTION",
		PrimaryPurpose:   "LIBRARY",
		Comment:          "The Go standard library and runtime of the toolchain that built the binary.",
		ExternalRefs:     []spdxExternalRef{purl("stdlib", goVersion)},
	}, "CONTAINS")
	mainVersion := bi.Main.Version
	if mainVersion == "" || mainVersion == "(devel)" {
		// -buildvcs=false leaves the main module unversioned: the release is.
		mainVersion = in.Version
	}
	add(spdxPackage{
		Name:             bi.Main.Path,
		SPDXID:           "SPDXRef-Main",
		VersionInfo:      mainVersion,
		DownloadLocation: ship.Source,
		LicenseConcluded: "NOASSERTION",
		LicenseDeclared:  ship.License,
		CopyrightText:    "NOASSERTION",
		PrimaryPurpose:   "SOURCE",
		Comment:          "The main module; package " + bi.Path + ".",
		ExternalRefs:     []spdxExternalRef{purl(bi.Main.Path, mainVersion)},
	}, "CONTAINS")
	for i, d := range bi.Deps {
		m := d
		comment := ""
		if d.Replace != nil {
			m = d.Replace
			comment = "Replaces " + d.Path + " " + d.Version + "."
		}
		p := spdxPackage{
			Name:             m.Path,
			SPDXID:           fmt.Sprintf("SPDXRef-Module-%d", i+1),
			VersionInfo:      m.Version,
			DownloadLocation: "NOASSERTION",
			LicenseConcluded: "NOASSERTION",
			LicenseDeclared:  "NOASSERTION",
			CopyrightText:    "NOASSERTION",
			PrimaryPurpose:   "LIBRARY",
			Comment:          strings.TrimSpace(comment + " go.sum: " + m.Sum),
			ExternalRefs:     []spdxExternalRef{purl(m.Path, m.Version)},
		}
		if c, ok := h1Checksum(m); ok {
			p.Checksums = []spdxChecksum{c}
		}
		if m.Version != "" && !strings.HasPrefix(m.Path, ".") && !strings.HasPrefix(m.Path, "/") {
			p.DownloadLocation = "https://proxy.golang.org/" + m.Path + "/@v/" + m.Version + ".zip"
		}
		add(p, "CONTAINS")
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// purl is the package URL of a Go module (purl's golang type).
func purl(path, version string) spdxExternalRef {
	p := "pkg:golang/" + path
	if version != "" {
		p += "@" + version
	}
	return spdxExternalRef{Category: "PACKAGE-MANAGER", Type: "purl", Locator: p}
}

// h1Checksum is a module's go.sum hash "h1:<base64>" as an SPDX SHA256
// checksum (the hash is a SHA-256, of the module's file list and file
// hashes).
func h1Checksum(m *debug.Module) (spdxChecksum, bool) {
	b64, ok := strings.CutPrefix(m.Sum, "h1:")
	if !ok {
		return spdxChecksum{}, false
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != sha256.Size {
		return spdxChecksum{}, false
	}
	return spdxChecksum{Algorithm: "SHA256", Value: hex.EncodeToString(raw)}, true
}
