package registry

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

var testCreds = Credentials{Username: "puller", Password: "s3cret"}

// startPrivate starts a registry whose hybrid-ccm/ repositories are private.
func startPrivate(t *testing.T) *Registry {
	t.Helper()
	return start(t, RequireAuth(ReleaseRepository, testCreds))
}

// statusOf is the HTTP status of a go-containerregistry error (0: none).
func statusOf(err error) int {
	var terr *transport.Error
	if errors.As(err, &terr) {
		return terr.StatusCode
	}
	return 0
}

// A private repository answers only its credentials: a pull or a push
// without them, or with a wrong password, is 401 with a Basic challenge (what
// containerd answers with a pod's pull Secret); with them, both work. Other
// repositories and the API root stay anonymous.
func TestRequireAuth(t *testing.T) {
	r := startPrivate(t)
	bin, _ := writeBinary(t, 1<<10)
	private := r.Host() + "/hybrid-ccm/talos-ccm:v1"
	// PushBinary pushes with the registry's credentials.
	if _, err := r.PushBinary(t.Context(), private, bin, ImageOptions{}); err != nil {
		t.Fatalf("push with the credentials: %v", err)
	}
	public := "registry.k8s.io/pause:3.10"
	if _, err := r.PushBinary(t.Context(), public, bin, ImageOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := func(s string) name.Reference {
		t.Helper()
		ref, err := name.ParseReference(s, name.StrictValidation)
		if err != nil {
			t.Fatal(err)
		}
		return ref
	}
	get := func(s string, auth authn.Authenticator) error {
		_, err := remote.Get(ref(s), remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport), remote.WithAuth(auth))
		return err
	}
	if err := get(private, authn.Anonymous); statusOf(err) != http.StatusUnauthorized {
		t.Errorf("anonymous pull of %s: %v, want 401", private, err)
	}
	if err := get(private, &authn.Basic{Username: "puller", Password: "wrong"}); statusOf(err) != http.StatusUnauthorized {
		t.Errorf("pull of %s with a wrong password: %v, want 401", private, err)
	}
	if err := get(private, &authn.Basic{Username: testCreds.Username, Password: testCreds.Password}); err != nil {
		t.Errorf("pull of %s with the credentials: %v", private, err)
	}
	mirrored, _ := r.Mirror(public)
	if err := get(mirrored.String(), authn.Anonymous); err != nil {
		t.Errorf("anonymous pull of the public %s: %v", mirrored, err)
	}
	// An anonymous push into the private repositories is refused too.
	img, err := binaryImage(bin, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = remote.Write(ref(r.Host()+"/hybrid-ccm/evil:v1"), img, remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport))
	if statusOf(err) != http.StatusUnauthorized {
		t.Errorf("anonymous push: %v, want 401", err)
	}

	// Plain requests, as containerd sends them: the challenge, and no
	// spelling of a private path that gets around it.
	for _, tc := range []struct {
		// path requested without credentials.
		path string
		// want is the status.
		want int
	}{
		{"/v2/", http.StatusOK},
		{"/v2/hybrid-ccm/talos-ccm/manifests/v1", http.StatusUnauthorized},
		{"/v2/hybrid-ccm/talos-ccm/tags/list", http.StatusUnauthorized},
		{"/v2/registry.k8s.io/../hybrid-ccm/talos-ccm/manifests/v1", http.StatusUnauthorized},
		{"/v2/_catalog", http.StatusUnauthorized},
		{"/v2/registry.k8s.io/pause/manifests/3.10", http.StatusOK},
		// a repository that merely starts with the prefix's name is not under it
		{"/v2/hybrid-ccm-other/x/manifests/v1", http.StatusNotFound},
	} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://"+r.Host()+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
		resp, err := r.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s: %d, want %d", tc.path, resp.StatusCode, tc.want)
		}
		if tc.want == http.StatusUnauthorized && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("GET %s: challenge %q, want Basic", tc.path, resp.Header.Get("WWW-Authenticate"))
		}
	}
}

// DockerConfigJSON is what a kubernetes.io/dockerconfigjson Secret holds and
// what `docker login` writes: go-containerregistry's default keychain reads
// it from DOCKER_CONFIG and pulls the private image with it; Release's
// environment points there and at Helm's copy.
func TestDockerConfigJSON(t *testing.T) {
	if _, err := start(t).DockerConfigJSON(); err == nil {
		t.Error("credentials of a registry without private repositories")
	}
	r := startPrivate(t)
	data, err := r.DockerConfigJSON()
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Auths map[string]struct{ Auth string } `json:"auths"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil || cfg.Auths[r.Host()].Auth != "cHVsbGVyOnMzY3JldA==" {
		t.Errorf("config %s (%v): want auths.%s.auth base64 of puller:s3cret", data, err, r.Host())
	}

	env, err := r.writeClientConfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range env {
		k, dir, _ := strings.Cut(kv, "=")
		file := filepath.Join(dir, "config.json")
		if k == "HELM_CONFIG_HOME" {
			file = filepath.Join(dir, "registry", "config.json")
		}
		got, err := os.ReadFile(file)
		if err != nil || string(got) != string(data) {
			t.Errorf("%s: %s (%v), want the config", k, got, err)
		}
		if k == "DOCKER_CONFIG" {
			t.Setenv(k, dir)
		}
	}
	bin, _ := writeBinary(t, 1<<10)
	private := r.Host() + "/hybrid-ccm/ccm-gate:v1"
	if _, err := r.PushBinary(t.Context(), private, bin, ImageOptions{}); err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(private)
	if _, err := remote.Get(ref, remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		t.Errorf("pull with DOCKER_CONFIG: %v", err)
	}
}

// RequireAuth refuses what is no repository prefix and empty credentials;
// Start fails and closes the listener.
func TestRequireAuthErrors(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		creds  Credentials
	}{
		{"", testCreds},
		{"/", testCreds},
		{"../x", testCreds},
		{"a/../b", testCreds},
		{"hybrid-ccm", Credentials{Username: "u"}},
		{"hybrid-ccm", Credentials{Password: "p"}},
		{"hybrid-ccm", Credentials{Username: "a:b", Password: "p"}},
	} {
		closed := false
		_, err := Start(fakeListener{addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, closed: &closed}, t.TempDir(), RequireAuth(tc.prefix, tc.creds))
		if err == nil || !strings.Contains(err.Error(), "require auth") || !closed {
			t.Errorf("RequireAuth(%q, %+v): err %v, listener closed %t", tc.prefix, tc.creds, err, closed)
		}
	}
}
