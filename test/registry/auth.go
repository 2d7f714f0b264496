package registry

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
)

// Credentials are a user name and password of HTTP basic authentication.
type Credentials struct {
	Username, Password string
}

// Option changes how Start serves the registry.
type Option func(*Registry) error

// RequireAuth makes the repositories under prefix private, as a private
// registry keeps a product's images: every request for one of them (its
// manifests, blobs, tags, uploads: pulls and pushes) and for the catalog
// needs HTTP basic authentication with c, or is answered 401 Unauthorized
// with a Basic challenge (what containerd, Helm and go-containerregistry
// answer with the credentials they hold for the registry). prefix is one or
// more repository path components ("hybrid-ccm": hybrid-ccm/talos-ccm, ...).
// Every other repository (the upstream images Mirror stores, the pause
// image, which containerd pulls for a sandbox without a pod's credentials)
// stays anonymous, and so does the API root /v2/.
func RequireAuth(prefix string, c Credentials) Option {
	return func(r *Registry) error {
		prefix = strings.Trim(prefix, "/")
		if prefix == "" || path.Clean(prefix) != prefix || strings.HasPrefix(prefix, ".") {
			return fmt.Errorf("require auth: repository prefix %q: want repository path components", prefix)
		}
		if c.Username == "" || c.Password == "" || strings.Contains(c.Username, ":") {
			return errors.New("require auth: want a user name without ':' and a password")
		}
		r.auth = &basicAuth{prefix: prefix, creds: c}
		return nil
	}
}

// basicAuth guards the private repositories.
type basicAuth struct {
	prefix string
	creds  Credentials
}

// private reports whether a request path is for a private repository or
// the catalog. Both the path as sent and as cleaned count: no spelling of a
// private repository's path gets past.
func (a *basicAuth) private(p string) bool {
	for _, q := range []string{p, path.Clean(p)} {
		if q == "/v2/_catalog" || strings.HasPrefix(q, "/v2/"+a.prefix+"/") || strings.Contains(q, "/..") {
			return true
		}
	}
	return false
}

func (a *basicAuth) authorized(req *http.Request) bool {
	user, pass, ok := req.BasicAuth()
	// both compared, whatever the first says
	u := subtle.ConstantTimeCompare([]byte(user), []byte(a.creds.Username))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(a.creds.Password))
	return ok && u&p == 1
}

// handler answers requests for private repositories without the
// credentials with 401 and a Basic challenge, in the distribution API's
// error format, and passes the rest to next.
func (a *basicAuth) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if a.private(req.URL.Path) && !a.authorized(req) {
			w.Header().Set("WWW-Authenticate", `Basic realm="hybrid-ccm test registry"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}`+"\n")
			return
		}
		next.ServeHTTP(w, req)
	})
}

// Credentials are what RequireAuth was given; ok is false for a registry
// without private repositories.
func (r *Registry) Credentials() (c Credentials, ok bool) {
	if r.auth == nil {
		return Credentials{}, false
	}
	return r.auth.creds, true
}

// Authenticator is what go-containerregistry clients of the registry (its
// own PushBinary and Release's check among them) authenticate with: the
// credentials, or none.
func (r *Registry) Authenticator() authn.Authenticator {
	if r.auth == nil {
		return authn.Anonymous
	}
	return &authn.Basic{Username: r.auth.creds.Username, Password: r.auth.creds.Password}
}

// DockerConfigJSON is Docker's config.json holding the registry's
// credentials for Host (auths.<Host>.auth: base64 of user:password): the
// .dockerconfigjson of a kubernetes.io/dockerconfigjson Secret, which the
// kubelet hands to containerd for images on Host; `docker login`'s file,
// which go-containerregistry reads; and Helm's registry configuration
// (`helm registry login`'s file). An error for a registry without private
// repositories.
func (r *Registry) DockerConfigJSON() ([]byte, error) {
	c, ok := r.Credentials()
	if !ok {
		return nil, fmt.Errorf("registry %s: no credentials: it has no private repositories (RequireAuth)", r.host)
	}
	type entry struct {
		Username string `json:"username"`
		Password string `json:"password"`
		Auth     string `json:"auth"`
	}
	return json.Marshal(map[string]map[string]entry{"auths": {r.host: {
		Username: c.Username, Password: c.Password,
		Auth: base64.StdEncoding.EncodeToString([]byte(c.Username + ":" + c.Password)),
	}}})
}

// writeClientConfig writes DockerConfigJSON as dir/docker/config.json and
// dir/helm/registry/config.json and returns the environment that makes
// go-containerregistry (DOCKER_CONFIG) and Helm (HELM_CONFIG_HOME)
// authenticate with it: `docker login` and `helm registry login` of a
// user's machine, for a subprocess.
func (r *Registry) writeClientConfig(dir string) ([]string, error) {
	data, err := r.DockerConfigJSON()
	if err != nil {
		return nil, err
	}
	docker := filepath.Join(dir, "docker")
	helm := filepath.Join(dir, "helm")
	for _, file := range []string{filepath.Join(docker, "config.json"), filepath.Join(helm, "registry", "config.json")} {
		if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(file, data, 0o600); err != nil {
			return nil, err
		}
	}
	return []string{"DOCKER_CONFIG=" + docker, "HELM_CONFIG_HOME=" + helm}, nil
}
