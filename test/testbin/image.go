package testbin

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// PlatformImage returns the image of one os/arch in an image index.
func PlatformImage(idx v1.ImageIndex, platform string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, m := range im.Manifests {
		if m.Platform != nil && m.Platform.OS+"/"+m.Platform.Architecture == platform {
			return idx.Image(m.Digest)
		}
	}
	return nil, fmt.Errorf("no image for %s", platform)
}

// ExtractBinary writes /<name> of img (the one layer of a release image) to
// the file out, executable.
func ExtractBinary(img v1.Image, name, out string) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	if len(layers) == 0 {
		return errors.New("an image without layers")
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err != nil {
			return fmt.Errorf("no %s in the image: %w", name, err)
		}
		if hdr.Name != name {
			continue
		}
		f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
}
