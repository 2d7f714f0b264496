package publish

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// EmptyMediaType is OCI 1.1's empty descriptor's media type: the config of
// an artifact manifest that has no config (the SBOM's).
const EmptyMediaType = "application/vnd.oci.empty.v1+json"

// rawManifest is a manifest pushed as its bytes (go-containerregistry's
// v1.Manifest has no artifactType).
type rawManifest struct {
	raw       []byte
	mediaType types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.raw, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mediaType, nil }

// Manifest is an OCI image manifest with OCI 1.1's fields.
type Manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     types.MediaType   `json:"mediaType"`
	ArtifactType  string            `json:"artifactType,omitempty"`
	Config        v1.Descriptor     `json:"config"`
	Layers        []v1.Descriptor   `json:"layers"`
	Subject       *v1.Descriptor    `json:"subject,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// Blob is a blob of a manifest to push and its descriptor.
type Blob struct {
	data []byte
	desc v1.Descriptor
}

func newBlob(data []byte, mt types.MediaType, annotations map[string]string) (Blob, error) {
	h, n, err := v1.SHA256(bytes.NewReader(data))
	if err != nil {
		return Blob{}, err
	}
	return Blob{data: data, desc: v1.Descriptor{MediaType: mt, Size: n, Digest: h, Annotations: annotations}}, nil
}

// PushManifest uploads the blobs and then puts the manifest at ref (a tag,
// or the manifest's digest in repo when ref is nil). It returns the
// manifest's digest.
func PushManifest(repo name.Repository, ref name.Reference, m Manifest, blobs []Blob, ropts []remote.Option) (v1.Hash, error) {
	for _, b := range blobs {
		if err := remote.WriteLayer(repo, static.NewLayer(b.data, b.desc.MediaType), ropts...); err != nil {
			return v1.Hash{}, fmt.Errorf("push blob %s to %s: %w", b.desc.Digest, repo, err)
		}
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return v1.Hash{}, err
	}
	h, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return v1.Hash{}, err
	}
	if ref == nil {
		ref = repo.Digest(h.String())
	}
	if err := remote.Put(ref, rawManifest{raw: raw, mediaType: m.MediaType}, ropts...); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", ref, err)
	}
	return h, nil
}

// SBOMManifest is the artifact manifest attaching sbom (SBOM's document) to
// the image manifest subject: artifactType and its one layer
// application/spdx+json, the empty config, created at the image's time. The
// same document and subject give the same manifest.
func SBOMManifest(sbom []byte, subject v1.Descriptor, title string, created time.Time) (Manifest, []Blob, error) {
	layer, err := newBlob(sbom, SPDXMediaType, map[string]string{ship.AnnotationTitle: title})
	if err != nil {
		return Manifest{}, nil, err
	}
	config, err := newBlob([]byte("{}"), EmptyMediaType, nil)
	if err != nil {
		return Manifest{}, nil, err
	}
	config.desc.Data = config.data
	sub := v1.Descriptor{MediaType: subject.MediaType, Size: subject.Size, Digest: subject.Digest}
	return Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  SPDXMediaType,
		Config:        config.desc,
		Layers:        []v1.Descriptor{layer.desc},
		Subject:       &sub,
		Annotations:   map[string]string{ship.AnnotationCreated: created.UTC().Format(time.RFC3339)},
	}, []Blob{config, layer}, nil
}

// attachSBOMs pushes an SBOM (SBOM) for every platform image of the image
// index pushed as ref, each an artifact whose subject is that platform's
// manifest (found through the referrers API, or its fallback tag where the
// registry has none), also tagged as cosign tags SBOMs (SBOMTag). It returns
// the SBOM manifests' digests by platform.
func attachSBOMs(o ship.Options, ref name.Reference, idx v1.ImageIndex, ropts []remote.Option) (map[string]v1.Hash, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	image := im.Annotations[ship.AnnotationTitle]
	created, err := time.Parse(time.RFC3339, im.Annotations[ship.AnnotationCreated])
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", ref, ship.AnnotationCreated, err)
	}
	out := map[string]v1.Hash{}
	for _, desc := range im.Manifests {
		if desc.Platform == nil {
			return nil, fmt.Errorf("%s: manifest %s has no platform", ref, desc.Digest)
		}
		platform := desc.Platform.OS + "/" + desc.Platform.Architecture
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return nil, err
		}
		bin, err := imageFile(img, image)
		if err != nil {
			return nil, fmt.Errorf("%s for %s: %w", ref, platform, err)
		}
		doc, err := SBOM(SBOMInput{Image: image, Version: o.Version, Platform: platform, Binary: bin,
			Created: created, Revision: im.Annotations[ship.AnnotationRevision]})
		if err != nil {
			return nil, err
		}
		title := image + "_" + o.Version + "_" + strings.ReplaceAll(platform, "/", "_") + ".spdx.json"
		m, blobs, err := SBOMManifest(doc, desc, title, created)
		if err != nil {
			return nil, err
		}
		d, err := PushManifest(ref.Context(), nil, m, blobs, ropts)
		if err != nil {
			return nil, fmt.Errorf("sbom of %s for %s: %w", ref, platform, err)
		}
		if err := fixFallbackArtifactType(ref.Context(), desc.Digest, d, SPDXMediaType, ropts); err != nil {
			return nil, fmt.Errorf("sbom of %s for %s: %w", ref, platform, err)
		}
		// cosign's tag for an SBOM (`cosign download sbom` looks there when
		// no referrer has its own artifact type): the same manifest.
		if _, err := PushManifest(ref.Context(), SBOMTag(ref.Context(), desc.Digest), m, nil, ropts); err != nil {
			return nil, fmt.Errorf("sbom of %s for %s: %w", ref, platform, err)
		}
		out[platform] = d
	}
	return out, nil
}

// fixFallbackArtifactType corrects the referrers fallback tag of subject
// (sha256-<hex>, an image index go-containerregistry writes where the
// registry has no referrers API) when it lists the artifact with its config's
// media type (the empty one) instead of its artifactType, as
// go-containerregistry v0.20 does: filters by artifact type find it then. A
// registry with the referrers API has no such tag; nothing to do.
func fixFallbackArtifactType(repo name.Repository, subject, artifact v1.Hash, artifactType string, ropts []remote.Option) error {
	tag := repo.Tag(subject.Algorithm + "-" + subject.Hex)
	idx, err := remote.Index(tag, ropts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("referrers fallback tag %s: %w", tag, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	changed := false
	for i, m := range im.Manifests {
		if m.Digest == artifact && m.ArtifactType != artifactType {
			im.Manifests[i].ArtifactType = artifactType
			changed = true
		}
	}
	if !changed {
		return nil
	}
	raw, err := json.Marshal(im)
	if err != nil {
		return err
	}
	if err := remote.Put(tag, rawManifest{raw: raw, mediaType: types.OCIImageIndex}, ropts...); err != nil {
		return fmt.Errorf("referrers fallback tag %s: %w", tag, err)
	}
	return nil
}

// imageFile is the content of the file name in the image's layers (the
// last layer that has it).
func imageFile(img v1.Image, file string) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	var found []byte
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				rc.Close()
				return nil, err
			}
			if strings.TrimPrefix(hdr.Name, "/") == file && hdr.Typeflag == tar.TypeReg {
				if found, err = io.ReadAll(tr); err != nil {
					rc.Close()
					return nil, err
				}
			}
		}
		rc.Close()
	}
	if found == nil {
		return nil, fmt.Errorf("no file /%s in the image", file)
	}
	return found, nil
}

// SBOMTag is where cosign looks for the SBOM of digest when no referrer
// is of its own artifact type: the tag sha256-<hex>.sbom.
func SBOMTag(repo name.Repository, digest v1.Hash) name.Tag {
	return repo.Tag(digest.Algorithm + "-" + digest.Hex + ".sbom")
}

// SignatureTag is where cosign keeps the signatures of digest: the tag
// sha256-<hex>.sig in the signed artifact's repository.
func SignatureTag(repo name.Repository, digest v1.Hash) name.Tag {
	return repo.Tag(digest.Algorithm + "-" + digest.Hex + ".sig")
}

// SignatureManifest is cosign's signature manifest for one signature: a
// config whose only diff_id is the payload's digest, one layer holding the
// simple-signing payload, the signature in its annotation.
func SignatureManifest(payload []byte, signature string) (Manifest, []Blob, error) {
	layer, err := newBlob(payload, SimpleSigningMediaType, map[string]string{SignatureAnnotation: signature})
	if err != nil {
		return Manifest{}, nil, err
	}
	cfg := v1.ConfigFile{
		RootFS:  v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{layer.desc.Digest}},
		History: []v1.History{{}},
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return Manifest{}, nil, err
	}
	config, err := newBlob(raw, types.OCIConfigJSON, nil)
	if err != nil {
		return Manifest{}, nil, err
	}
	return Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        config.desc,
		Layers:        []v1.Descriptor{layer.desc},
	}, []Blob{config, layer}, nil
}

// sign pushes the signature of digest in repo (cosign's format: the tag
// sha256-<hex>.sig). It replaces signatures already there.
func sign(s *Signer, repo name.Repository, digest v1.Hash, ropts []remote.Option) (name.Tag, error) {
	tag := SignatureTag(repo, digest)
	payload, err := SimpleSigningPayload(repo.Name(), digest.String())
	if err != nil {
		return tag, err
	}
	sig, err := s.Sign(payload)
	if err != nil {
		return tag, err
	}
	m, blobs, err := SignatureManifest(payload, sig)
	if err != nil {
		return tag, err
	}
	if _, err := PushManifest(repo, tag, m, blobs, ropts); err != nil {
		return tag, fmt.Errorf("sign %s@%s: %w", repo, digest, err)
	}
	return tag, nil
}
