package registry

import (
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestMirror(t *testing.T) {
	r := start(t)
	h := r.Host()
	for _, tc := range []struct{ ref, want string }{
		{"registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.2", h + "/registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.2"},
		{"registry.k8s.io/pause:3.10", h + "/registry.k8s.io/pause:3.10"},
		{"docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.26.0", h + "/docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.26.0"},
		{"hetznercloud/hcloud-cloud-controller-manager:v1.26.0", h + "/docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.26.0"},
		{"index.docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.26.0", h + "/docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.26.0"},
		{"busybox:1.36", h + "/docker.io/library/busybox:1.36"},
		{"docker.io/busybox:1.36", h + "/docker.io/library/busybox:1.36"},
		{"docker.io/library/busybox:1.36", h + "/docker.io/library/busybox:1.36"},
		{"busybox", h + "/docker.io/library/busybox:latest"},
		{"ghcr.io/oracle/cloud-provider-oci:v1.32.0", h + "/ghcr.io/oracle/cloud-provider-oci:v1.32.0"},
		{"quay.io/cloudscalech/cloudscale-cloud-controller-manager:1.2.0", h + "/quay.io/cloudscalech/cloudscale-cloud-controller-manager:1.2.0"},
		{"mcr.microsoft.com/oss/kubernetes/azure-cloud-controller-manager:v1.34.3", h + "/mcr.microsoft.com/oss/kubernetes/azure-cloud-controller-manager:v1.34.3"},
		{"registry.k8s.io/pause@" + testDigest, h + "/registry.k8s.io/pause@" + testDigest},
		{"registry.k8s.io/pause:3.10@" + testDigest, h + "/registry.k8s.io/pause@" + testDigest},
		{"nginx@" + testDigest, h + "/docker.io/library/nginx@" + testDigest},
		// On the registry itself: as it is.
		{h + "/hybrid-ccm/talos-ccm:v0.1.0", h + "/hybrid-ccm/talos-ccm:v0.1.0"},
		{h + "/hybrid-ccm/talos-ccm@" + testDigest, h + "/hybrid-ccm/talos-ccm@" + testDigest},
	} {
		got, err := r.Mirror(tc.ref)
		if err != nil {
			t.Errorf("Mirror(%q): %v", tc.ref, err)
			continue
		}
		if got.String() != tc.want {
			t.Errorf("Mirror(%q) = %s, want %s", tc.ref, got, tc.want)
		}
	}
	for _, ref := range []string{
		"",
		"Registry.K8s.io/Pause:3.10",
		"registry.k8s.io/pause:bad tag",
		"registry.k8s.io/pause@sha256:short",
		"registry.k8s.io/pause:",
		"myregistry.example:5000/team/app:1", // a port is no repository path component
		"https://registry.k8s.io/pause:3.10",
	} {
		got, err := r.Mirror(ref)
		if err == nil {
			t.Errorf("Mirror(%q) = %s, want an error", ref, got)
			continue
		}
		if !strings.Contains(err.Error(), `"`+ref+`"`) {
			t.Errorf("Mirror(%q): error %q does not name the reference", ref, err)
		}
	}
}

// Every built-in profile's CCM image (every release it names) can be
// mirrored, and its registry is one WriteHostsDir maps by default.
func TestMirrorProfileImages(t *testing.T) {
	r := start(t)
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range set.Names() {
		p, _ := set.Get(n)
		tags := slices.Collect(maps.Values(p.CCM.Image.Tags))
		if p.CCM.Image.Tag != "" {
			tags = append(tags, p.CCM.Image.Tag)
		}
		for _, tag := range tags {
			ref := p.CCM.Image.Repository + ":" + tag
			m, err := r.Mirror(ref)
			if err != nil {
				t.Errorf("profile %s: %v", n, err)
				continue
			}
			upstream := strings.SplitN(m.Context().RepositoryStr(), "/", 2)[0]
			if !slices.Contains(UpstreamHosts, upstream) {
				t.Errorf("profile %s: image %s is on %s, not in UpstreamHosts %v", n, ref, upstream, UpstreamHosts)
			}
		}
	}
}

// hostsFile is containerd's hosts.toml, the fields this package writes.
type hostsFile struct {
	Server       string                    `toml:"server"`
	Capabilities []string                  `toml:"capabilities"`
	CA           string                    `toml:"ca"`
	OverridePath bool                      `toml:"override_path"`
	Host         map[string]map[string]any `toml:"host"`
}

func readHostsFile(t *testing.T, path string) hostsFile {
	t.Helper()
	var f hostsFile
	md, err := toml.DecodeFile(path, &f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if u := md.Undecoded(); len(u) != 0 {
		t.Errorf("%s: unexpected keys %v", path, u)
	}
	// containerd 1.6 ignores a file without a host table.
	if !md.IsDefined("host") {
		t.Errorf("%s: no [host] table", path)
	}
	if len(f.Host) != 0 {
		t.Errorf("%s: hosts %v, want the server only", path, f.Host)
	}
	return f
}

func TestWriteHostsDir(t *testing.T) {
	r := start(t)
	bin, _ := writeBinary(t, 100)
	if _, err := r.PushBinary(t.Context(), "registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.2", bin, ImageOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PushBinary(t.Context(), "hetznercloud/hcloud-cloud-controller-manager:v1.35.0", bin, ImageOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PushBinary(t.Context(), r.Host()+"/hybrid-ccm/talos-ccm:v0.1.0", bin, ImageOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	// index.docker.io is docker.io; duplicates and the registry itself are
	// written once.
	if err := r.WriteHostsDir(dir, "registry.k8s.io", "index.docker.io", "docker.io", r.Host()); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{r.Host(), "docker.io", "registry.k8s.io"}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("host directories %v, want %v", names, want)
	}

	for _, tc := range []struct {
		host, server string
		overridePath bool
		// repository and tag of an image containerd would pull with it
		repo, tag string
	}{
		{"registry.k8s.io", "https://" + r.Host() + "/v2/registry.k8s.io", true, "provider-aws/cloud-controller-manager", "v1.36.2"},
		{"docker.io", "https://" + r.Host() + "/v2/docker.io", true, "hetznercloud/hcloud-cloud-controller-manager", "v1.35.0"},
		{r.Host(), "https://" + r.Host(), false, "hybrid-ccm/talos-ccm", "v0.1.0"},
	} {
		f := readHostsFile(t, filepath.Join(dir, tc.host, "hosts.toml"))
		if f.Server != tc.server || f.CA != r.CAFile() || f.OverridePath != tc.overridePath ||
			!slices.Equal(f.Capabilities, []string{"pull", "resolve"}) {
			t.Errorf("%s/hosts.toml: %+v, want server %s, ca %s, override_path %v, capabilities pull, resolve",
				tc.host, f, tc.server, r.CAFile(), tc.overridePath)
		}
		// The manifest request containerd makes from it: the server's path
		// is the API root with override_path, else /v2 is appended.
		root := f.Server
		if !f.OverridePath {
			root += "/v2"
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodHead, root+"/"+tc.repo+"/manifests/"+tc.tag, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
		resp, err := r.HTTPClient().Do(req)
		if err != nil {
			t.Errorf("%s: %v", req.URL, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("HEAD %s: %s", req.URL, resp.Status)
		}
	}
}

func TestWriteHostsDirDefaults(t *testing.T) {
	r := start(t)
	dir := t.TempDir()
	if err := r.WriteHostsDir(dir); err != nil {
		t.Fatal(err)
	}
	for _, h := range append(slices.Clone(UpstreamHosts), r.Host()) {
		f := readHostsFile(t, filepath.Join(dir, h, "hosts.toml"))
		if h != r.Host() && f.Server != "https://"+r.Host()+"/v2/"+h {
			t.Errorf("%s: server %s", h, f.Server)
		}
	}
}

func TestWriteHostsDirErrors(t *testing.T) {
	r := start(t)
	for _, h := range []string{"", "https://registry.k8s.io", "registry.k8s.io/sub", "Registry.k8s.io", "myregistry.example:5000"} {
		err := r.WriteHostsDir(t.TempDir(), h)
		if err == nil {
			t.Errorf("WriteHostsDir(%q) succeeded", h)
		} else if h != "" && !strings.Contains(err.Error(), h) {
			t.Errorf("WriteHostsDir(%q): error %q does not name the host", h, err)
		}
	}
}

func TestTOMLString(t *testing.T) {
	for _, s := range []string{`/tmp/a b/ca.crt`, `C:\x`, `quote"d`, "tab\there", "ünï"} {
		var v struct{ S string }
		if _, err := toml.Decode("S = "+tomlString(s), &v); err != nil {
			t.Errorf("tomlString(%q) = %s: %v", s, tomlString(s), err)
		} else if v.S != s {
			t.Errorf("tomlString(%q) decodes to %q", s, v.S)
		}
	}
}
