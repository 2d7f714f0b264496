package registry

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// DockerHub is the name containerd (and Kubernetes) give Docker Hub: what
// "nginx" and "index.docker.io/library/nginx" mean.
const DockerHub = "docker.io"

// UpstreamHosts are the registries the charts and the built-in profiles
// (profiles/*.yaml) name images on, and registry.k8s.io for the pause image:
// what WriteHostsDir maps when it is given none.
var UpstreamHosts = []string{"registry.k8s.io", "docker.io", "ghcr.io", "quay.io", "mcr.microsoft.com"}

// Mirror maps an upstream image reference to where it is stored in this
// registry: <Host>/<upstream host>/<repository> with the same tag or digest,
// so "registry.k8s.io/pause:3.10" is "<Host>/registry.k8s.io/pause:3.10"
// and "hetznercloud/hcloud-cloud-controller-manager:v1.26.0" is
// "<Host>/docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.26.0".
// Names are read as containerd reads them: no registry means docker.io, a
// single Docker Hub name is under library/, no tag or digest means latest.
// A reference already on Host is returned as it is.
func (r *Registry) Mirror(ref string) (name.Reference, error) {
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("mirror image %q: %w", ref, err)
	}
	upstream := parsed.Context().RegistryStr()
	if upstream == r.host {
		return parsed, nil
	}
	if upstream == name.DefaultRegistry {
		upstream = DockerHub
	}
	if strings.Contains(upstream, ":") {
		// host:port is no repository path component.
		return nil, fmt.Errorf("mirror image %q: registry %s has a port; only registries on the default port can be mirrored", ref, upstream)
	}
	repo := r.host + "/" + upstream + "/" + parsed.Context().RepositoryStr()
	var out name.Reference
	switch p := parsed.(type) {
	case name.Tag:
		out, err = name.NewTag(repo+":"+p.TagStr(), name.StrictValidation)
	case name.Digest:
		out, err = name.NewDigest(repo+"@"+p.DigestStr(), name.StrictValidation)
	default:
		err = fmt.Errorf("unknown reference type %T", parsed)
	}
	if err != nil {
		return nil, fmt.Errorf("mirror image %q: %w", ref, err)
	}
	return out, nil
}

// WriteHostsDir writes containerd's registry host configuration into dir —
// the directory containerd's CRI plugin reads as
// [plugins."io.containerd.grpc.v1.cri".registry] config_path (containerd
// 1.5 and later), one dir/<host>/hosts.toml per registry host — so that
// containerd pulls every image named on one of upstreamHosts (default:
// UpstreamHosts) from this registry where Mirror stores it, and trusts the
// registry's CA for images named on Host itself (a release pushed to it).
//
// For an upstream host, say registry.k8s.io, the file's server is
// https://<Host>/v2/registry.k8s.io with override_path (the URL's path is
// the API root: containerd appends /<repository>/manifests/<tag> and so on,
// not /v2/...), ca = CAFile, capabilities pull and resolve. It is the only
// host: the upstream is never tried, so an image the test did not push
// fails at once as not found, not after a dial timeout. An empty [host]
// table follows, because containerd 1.6 ignores a hosts.toml without one.
// For Host itself the server is https://<Host>, with the CA. (Checked with
// containerd 1.6.20: CRI pulls through these files, one request per missing
// image; a file without [host] made it go to the upstream.)
func (r *Registry) WriteHostsDir(dir string, upstreamHosts ...string) error {
	if len(upstreamHosts) == 0 {
		upstreamHosts = UpstreamHosts
	}
	var hosts []string
	for _, h := range upstreamHosts {
		if h == name.DefaultRegistry {
			h = DockerHub
		}
		if h == r.host {
			continue // always written
		}
		if err := checkUpstreamHost(h); err != nil {
			return fmt.Errorf("write registry hosts to %s: %w", dir, err)
		}
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	write := func(host, comment, server string, overridePath bool) error {
		d := filepath.Join(dir, host)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(hostsTOML(comment, server, overridePath, r.caFile)), 0o644)
	}
	for _, h := range hosts {
		comment := fmt.Sprintf("Images named %s/... are pulled from the test registry at %s,\n"+
			"which stores them under /v2/%s/...; %s itself is never tried.", h, r.host, h, h)
		if err := write(h, comment, "https://"+r.host+"/v2/"+h, true); err != nil {
			return fmt.Errorf("write registry hosts for %s to %s: %w", h, dir, err)
		}
	}
	comment := fmt.Sprintf("The test registry at %s: images pushed to it under its own name.", r.host)
	if err := write(r.host, comment, "https://"+r.host, false); err != nil {
		return fmt.Errorf("write registry hosts for %s to %s: %w", r.host, dir, err)
	}
	return nil
}

// hostsTOML is one hosts.toml: server the only host, with the CA, pull
// and resolve.
func hostsTOML(comment, server string, overridePath bool, ca string) string {
	var b strings.Builder
	for _, line := range strings.Split(comment, "\n") {
		b.WriteString("# " + line + "\n")
	}
	b.WriteString("# Written by hybrid-ccm test/registry.\n")
	fmt.Fprintf(&b, "server = %s\n", tomlString(server))
	b.WriteString("capabilities = [\"pull\", \"resolve\"]\n")
	fmt.Fprintf(&b, "ca = %s\n", tomlString(ca))
	if overridePath {
		b.WriteString("override_path = true\n")
	}
	b.WriteString("\n" +
		"# containerd 1.6 ignores a hosts.toml without a host table (it logs \"invalid\n" +
		"# `host` tree\" and pulls from the upstream); an empty one keeps the server\n" +
		"# above the only host.\n" +
		"[host]\n")
	return b.String()
}

// checkUpstreamHost accepts a registry host name as containerd names host
// namespaces: a lower-case DNS name without port, scheme or path.
func checkUpstreamHost(h string) error {
	if h == "" {
		return fmt.Errorf("empty registry host")
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return fmt.Errorf("registry host %q: want a lower-case host name without scheme, port or path", h)
		}
	}
	return nil
}

// tomlString is s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteRune(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, "\\u%04X", c)
		default:
			b.WriteRune(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
