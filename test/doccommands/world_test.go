package doccommands

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/hybrid-ccm/hybrid-ccm/test/registry"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// world is what the docs' commands run against: a real kube-apiserver (with
// the talos.dev ServiceAccount CRD Talos installs), an OCI registry over
// HTTPS, the CLIs on PATH, and a working directory laid out as a user's
// checkout (charts/, docs/deploy/, the gitops layout's clusters/, the files
// the docs name).
type world struct {
	// repo is the repository root: make runs there.
	repo string
	// work is the user's directory: copies of charts/, docs/deploy/ and
	// gitops/clusters/, and the yaml files the docs name (clouds.yaml).
	work string
	// bin holds the CLIs the commands run (tools), first on their PATH.
	bin  string
	env  []string
	kube kubernetes.Interface
	dyn  dynamic.Interface
	reg  *registry.Registry
	// named are the yaml and ini blocks the docs name ("# clouds.yaml",
	// "# cloud.conf"), by name; newWorld writes them into work.
	named map[string]string
	// ran maps a command as run (after substitution) to its output: two doc
	// lines that are one command here run once.
	ran map[string]string
}

// cosignPassword is $COSIGN_PASSWORD for the docs' cosign lines.
const cosignPassword = "doc-cosign-password"

// hcloudToken is $HCLOUD_TOKEN for the docs' `kubectl create secret` lines.
const hcloudToken = "doc-token-0123456789"

// awsAccessKey and awsSecretKey are $AWS_ACCESS_KEY_ID and
// $AWS_SECRET_ACCESS_KEY for docs/install.md's aws-ccm Secret: a stand-in key
// in the shape of an IAM user's.
const (
	awsAccessKey = "AKIAIOSFODNN7DOCTEST"
	awsSecretKey = "doc-secret-access-key-0123456789abcdefghij"
)

var nativeCCMs = schema.GroupVersionResource{Group: "hybridccm.io", Version: "v1alpha1", Resource: "nativeccms"}

func newWorld(t *testing.T, named map[string]string) *world {
	t.Helper()
	repo := testenv.RepoRoot()
	w := &world{repo: repo, work: t.TempDir(), named: named, ran: map[string]string{}}
	for _, d := range []string{"charts/talos-ccm", "charts/ccm-coordinator", "charts/native-ccm", "charts/hybrid-ccm", "docs/deploy"} {
		copyDir(t, filepath.Join(repo, d), filepath.Join(w.work, d))
	}
	copyDir(t, filepath.Join(repo, "gitops", "clusters"), filepath.Join(w.work, "clusters"))
	for name, content := range named {
		writeFile(t, filepath.Join(w.work, name), content)
	}
	bin := tools(t, repo)
	w.bin = bin

	start := time.Now()
	env := w.startAPIServer(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if w.reg, err = registry.Start(lis, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.reg.Close() })
	t.Logf("API server and registry %s up in %s", w.reg.Host(), time.Since(start).Round(time.Millisecond))

	gocache := strings.Fields(goCmd(t, repo, "env", "GOCACHE", "GOMODCACHE"))
	w.env = append(os.Environ(),
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"KUBECACHEDIR="+t.TempDir(),
		"HELM_CONFIG_HOME="+t.TempDir(),
		"HELM_CACHE_HOME="+t.TempDir(),
		"HELM_DATA_HOME="+t.TempDir(),
		"DOCKER_CONFIG="+t.TempDir(),
		// skopeo, helm and make release (Go) trust the registry's CA
		// through it, besides the system's roots.
		"SSL_CERT_FILE="+caBundle(t, w.reg.CAFile()),
		"NO_PROXY="+strings.Trim(os.Getenv("NO_PROXY")+",127.0.0.1", ","),
		"no_proxy="+strings.Trim(os.Getenv("no_proxy")+",127.0.0.1", ","),
		"HCLOUD_TOKEN="+hcloudToken,
		"AWS_ACCESS_KEY_ID="+awsAccessKey, "AWS_SECRET_ACCESS_KEY="+awsSecretKey,
		// cosign generate-key-pair's password, and make release's to read
		// the key (docs/supply-chain.md)
		"COSIGN_PASSWORD="+cosignPassword,
		"GOCACHE="+gocache[0], "GOMODCACHE="+gocache[1],
	)
	w.useAPIServer(env)
	return w
}

// startAPIServer starts a kube-apiserver with the CRD Talos installs
// (talos.dev ServiceAccount), stopped when the test ends.
func (w *world) startAPIServer(t *testing.T) *testenv.Env {
	t.Helper()
	env, err := testenv.Start(testenv.Options{CRDDirectoryPaths: []string{filepath.Join(w.repo, "charts", "test", "testdata", "crds")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env
}

// useAPIServer points the world's clients and KUBECONFIG at env.
func (w *world) useAPIServer(env *testenv.Env) {
	w.kube = env.Client
	w.dyn = dynamic.NewForConfigOrDie(env.Config)
	w.env = append(w.env[:len(w.env):len(w.env)], "KUBECONFIG="+env.KubeconfigPath)
}

// freshCluster is the world with an API server of its own instead.
func (w *world) freshCluster(t *testing.T) *world {
	t.Helper()
	f := *w
	f.ran = map[string]string{}
	f.useAPIServer(f.startAPIServer(t))
	return &f
}

// caBundle is the registry's CA, after the certificates of an SSL_CERT_FILE
// already set (Go reads one file).
func caBundle(t *testing.T, ca string) string {
	prev := os.Getenv("SSL_CERT_FILE")
	if prev == "" {
		return ca
	}
	a, err := os.ReadFile(prev)
	if err != nil {
		t.Fatalf("SSL_CERT_FILE: %v", err)
	}
	b, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca-bundle.crt")
	writeFile(t, p, string(a)+"\n"+string(b))
	return p
}

// sh runs line with bash in dir (w.repo or w.work) and the world's
// environment, and returns its output; a failure fails the test.
func (w *world) sh(t *testing.T, dir, line string) string {
	t.Helper()
	out, err := w.trySh(dir, line)
	if err != nil {
		t.Fatalf("$ %s\n%s\n%v", line, out, err)
	}
	return out
}

func (w *world) trySh(dir, line string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", line)
	cmd.Dir = dir
	cmd.Env = w.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// helmRelease is a release as `helm list -o json` shows it.
type helmRelease struct {
	Name     string `json:"name"`
	Revision string `json:"revision"`
	Status   string `json:"status"`
	// Chart is <name>-<version>.
	Chart string `json:"chart"`
}

// release returns the release name in ns (any status), or nil when Helm
// has none.
func (w *world) release(t *testing.T, name, ns string) *helmRelease {
	t.Helper()
	line := "helm list -a -n " + ns + " --filter '^" + name + "$' -o json"
	out, err := w.trySh(w.work, line)
	if err != nil {
		t.Fatalf("$ %s: %v\n%s", line, err, out)
	}
	var rs []helmRelease
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("$ %s: %v\n%s", line, err, out)
	}
	if len(rs) == 0 {
		return nil
	}
	return &rs[0]
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
