package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// ReleaseRepository is where Release pushes, under Host: the registry
// `make release` is given is <Host>/hybrid-ccm.
const ReleaseRepository = "hybrid-ccm"

// ReleaseRegistry is the REGISTRY Release gives `make release`:
// <Host>/hybrid-ccm. The images are <ReleaseRegistry>/<name>:<version>, the
// charts <ReleaseRegistry>/charts/<name>:<version> (ship.ImageRef,
// ship.ChartRef).
func (r *Registry) ReleaseRegistry() string { return r.host + "/" + ReleaseRepository }

// Release releases the repository at root to this registry exactly as a user
// does: `make release REGISTRY=<Host>/hybrid-ccm VERSION=<version>
// PLATFORMS=linux/<GOARCH>` in root, a subprocess with this process's
// environment, plus SSL_CERT_FILE naming the registry's CA (Go's TLS, and so
// both the image push and Helm's chart push, then trusts it besides the
// system's roots) and the registry's address in NO_PROXY. make's output goes
// to log (nil: discarded). It then checks that every image (ship.Images) and
// every chart (ship.Charts) is in the registry at version.
//
// A registry with private repositories (RequireAuth) gets the credentials
// as a user logged in with `docker login` and `helm registry login` has
// them: DOCKER_CONFIG and HELM_CONFIG_HOME name files DockerConfigJSON
// wrote.
//
// make release builds into the layout IMAGES_DIR=<this registry's
// directory>/release-images, not root/bin/images: tests releasing at once
// from one checkout (test/doccommands checks what `make release` left in
// bin/images) keep out of each other's way.
//
// It signs nothing (SIGNING_KEY= on make's command line, whatever the
// environment says); ReleaseSigned signs.
func (r *Registry) Release(ctx context.Context, root, version string, log io.Writer) error {
	return r.release(ctx, root, version, "", log)
}

// ReleaseSigned is Release with `make release SIGNING_KEY=<keyFile>`: every
// image and chart signed with the key (cosign's format). COSIGN_PASSWORD
// comes from this process's environment.
func (r *Registry) ReleaseSigned(ctx context.Context, root, version, keyFile string, log io.Writer) error {
	if keyFile == "" {
		return errors.New("release: no signing key")
	}
	return r.release(ctx, root, version, keyFile, log)
}

func (r *Registry) release(ctx context.Context, root, version, keyFile string, log io.Writer) error {
	if version == "" {
		return errors.New("release: no version")
	}
	if log == nil {
		log = io.Discard
	}
	caFile, err := r.releaseCAFile()
	if err != nil {
		return fmt.Errorf("release %s: %w", version, err)
	}
	args := []string{"release", "REGISTRY=" + r.ReleaseRegistry(), "VERSION=" + version, "PLATFORMS=linux/" + runtime.GOARCH, "SIGNING_KEY=" + keyFile,
		"IMAGES_DIR=" + filepath.Join(r.dir, "release-images")}
	cmd := exec.CommandContext(ctx, "make", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+caFile)
	if r.auth != nil {
		// `docker login` and `helm registry login` of the releasing user
		env, err := r.writeClientConfig(filepath.Join(r.dir, "client"))
		if err != nil {
			return fmt.Errorf("release %s: %w", version, err)
		}
		cmd.Env = append(cmd.Env, env...)
	}
	if host, _, err := net.SplitHostPort(r.host); err == nil {
		for _, k := range []string{"NO_PROXY", "no_proxy"} {
			cmd.Env = append(cmd.Env, k+"="+strings.Trim(os.Getenv(k)+","+host, ","))
		}
	}
	tail := &tailBuffer{max: 8 << 10}
	cmd.Stdout = io.MultiWriter(log, tail)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("release %s: make %s in %s: %w\n%s", version, strings.Join(args, " "), root, err, tail.String())
	}

	var refs []string
	for _, img := range ship.Images {
		refs = append(refs, ship.ImageRef(r.ReleaseRegistry(), img, version))
	}
	for _, ch := range ship.Charts {
		refs = append(refs, ship.ChartRef(r.ReleaseRegistry(), ch, version))
	}
	var missing []error
	for _, s := range refs {
		ref, err := name.ParseReference(s, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("release %s: %w", version, err)
		}
		if _, err := remote.Head(ref, remote.WithContext(ctx), remote.WithTransport(r.transport), remote.WithAuth(r.Authenticator())); err != nil {
			missing = append(missing, fmt.Errorf("%s: %w", s, err))
		}
	}
	if err := errors.Join(missing...); err != nil {
		return fmt.Errorf("release %s: make release succeeded but the registry lacks:\n%w", version, err)
	}
	return nil
}

// releaseCAFile is the file `make release` gets as SSL_CERT_FILE: the
// registry's CA, with the certificates of an SSL_CERT_FILE already set
// before it (Go reads one file; it still reads the system's certificate
// directories besides).
func (r *Registry) releaseCAFile() (string, error) {
	prev := os.Getenv("SSL_CERT_FILE")
	if prev == "" {
		return r.caFile, nil
	}
	a, err := os.ReadFile(prev)
	if err != nil {
		return "", fmt.Errorf("SSL_CERT_FILE: %w", err)
	}
	b, err := os.ReadFile(r.caFile)
	if err != nil {
		return "", err
	}
	bundle := filepath.Join(r.dir, "ca-bundle.crt")
	if err := os.WriteFile(bundle, append(append(a, '\n'), b...), 0o644); err != nil {
		return "", err
	}
	return bundle, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.buf) }
