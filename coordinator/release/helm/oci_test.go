package helm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// ociRegistry is an OCI distribution server on loopback: go-containerregistry's
// registry (a maintained implementation of the distribution API), with a log
// of the requests it served.
type ociRegistry struct {
	handler http.Handler
	mu      sync.Mutex
	log     []string // "METHOD path"
}

func newOCIRegistry() *ociRegistry {
	return &ociRegistry{handler: ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))}
}

func (r *ociRegistry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.log = append(r.log, req.Method+" "+req.URL.Path)
	r.mu.Unlock()
	r.handler.ServeHTTP(w, req)
}

// served returns the logged requests that start with prefix.
func (r *ociRegistry) served(prefix string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.log {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// ociChart packages, with Helm, a chart shaped like an upstream CCM chart:
// default controllers and lease, its own ServiceAccount bound to cluster-admin.
// build is written into the Deployment template (so two builds of one version
// differ in content).
func ociChart(t *testing.T, name, version, build string) []byte {
	t.Helper()
	ch := &chart.Chart{
		Metadata: &chart.Metadata{APIVersion: chart.APIVersionV2, Name: name, Version: version},
		Values:   map[string]any{"image": "upstream/ccm:v0", "secretName": "hcloud"},
		Templates: []*chart.File{{Name: "templates/ccm.yaml", Data: []byte(releasetest.UpstreamCCMTemplate(
			"    example.com/chart-version: {{ .Chart.Version | quote }}\n    example.com/build: \""+build+"\"\n",
			"          command: [/bin/ccm, --controllers=*, --cloud-provider=hcloud]\n          args: [--leader-elect=true, --secure-port=10258]\n"))}},
	}
	file, err := chartutil.Save(ch, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// hermeticHelm keeps Helm's registry client away from the user's Helm and
// Docker credentials.
func hermeticHelm(t *testing.T) {
	t.Setenv("HELM_CONFIG_HOME", t.TempDir())
	t.Setenv("DOCKER_CONFIG", t.TempDir())
}

// pushChart pushes a chart archive with Helm's own registry client.
func pushChart(t *testing.T, rc *registry.Client, host, name, version, build string) *registry.PushResult {
	t.Helper()
	res, err := rc.Push(ociChart(t, name, version, build), host+"/charts/"+name+":"+version)
	if err != nil {
		t.Fatalf("helm push %s:%s: %v", name, version, err)
	}
	return res
}

// ociRequest is the hcloud profile installing chart <repository>/fake-ccm at
// version from an OCI registry.
func ociRequest(t *testing.T, repository, version, namespace string) release.Request {
	t.Helper()
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := set.Get("hcloud")
	q := *p
	q.Chart = profile.Chart{
		Source: profile.ChartOCI, Repository: repository, Name: "fake-ccm", Version: version,
		Values: map[string]any{"secretName": "{{ .SecretName }}", "image": "{{ .Image.Repository }}:{{ .Image.Tag }}"},
	}
	req, err := release.FromProfile(&q, release.Instance{ReleaseName: "native-ccm-oci", Namespace: namespace, Platform: "hcloud"})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestOCIChartInstalledFromRegistry: a chart pushed with Helm's registry client
// to an OCI registry on loopback (TLS, the default) is pulled by the engine at
// the profile's version and installed with the real Helm SDK against the real
// API server, held to lifecycle-only operation by the post-renderer. A missing
// version is a chart error naming the reference, and pulls are cached by tag
// for the engine's lifetime.
func TestOCIChartInstalledFromRegistry(t *testing.T) {
	hermeticHelm(t)
	reg := newOCIRegistry()
	srv := httptest.NewTLSServer(reg)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "https://")

	push, err := registry.NewClient(registry.ClientOptHTTPClient(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	pushChart(t, push, host, "fake-ccm", "1.0.0", "a")
	pushed := pushChart(t, push, host, "fake-ccm", "1.1.0", "a")
	if len(reg.served("PUT /v2/charts/fake-ccm/blobs/uploads/")) == 0 || len(reg.served("PUT /v2/charts/fake-ccm/manifests/1.1.0")) != 1 {
		t.Fatalf("push did not go through the upload flow: %v", reg.log)
	}

	env, err := testenv.Start(testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	const ns = "oci-test"
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The engine trusts the registry's certificate through Options.HTTPClient,
	// as a real coordinator trusts a registry through the system roots.
	e := NewEngine(env.Config, Options{Timeout: time.Minute, HTTPClient: srv.Client()})
	repository := "oci://" + host + "/charts"

	t.Run("wrong version names the reference", func(t *testing.T) {
		req := ociRequest(t, repository, "9.9.9", ns)
		info, err := e.Install(ctx, req)
		var ce *release.ChartError
		if !errors.As(err, &ce) {
			t.Fatalf("err = %v, want a release.ChartError", err)
		}
		t.Log(err)
		ref := host + "/charts/fake-ccm:9.9.9"
		if !strings.Contains(err.Error(), ref) || !strings.Contains(err.Error(), "not found") {
			t.Errorf("error %q does not name %s as not found", err, ref)
		}
		if info != nil {
			t.Errorf("a release was recorded: %+v", info)
		}
	})

	req := ociRequest(t, repository, "1.1.0", ns)
	before := len(reg.served("GET /v2/charts/fake-ccm/"))
	info, err := e.Install(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Deployed() || info.Chart != "fake-ccm@1.1.0" || info.Revision != 1 || info.Digest != req.Digest() {
		t.Errorf("info = %+v", info)
	}
	pulled := reg.served("GET /v2/charts/fake-ccm/")[before:]
	if len(pulled) == 0 || pulled[0] != "GET /v2/charts/fake-ccm/manifests/1.1.0" || !slices.Contains(pulled, "GET /v2/charts/fake-ccm/blobs/"+pushed.Chart.Digest) {
		t.Errorf("tag 1.1.0 and its chart layer %s not pulled: %v", pushed.Chart.Digest, pulled)
	}

	// What Helm stored is what the post-renderer allowed.
	cfg, err := e.config(ns)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := action.NewGet(cfg).Run(req.Name)
	if err != nil {
		t.Fatal(err)
	}
	releasetest.AssertLifecycleOnly(t, rel.Manifest, req.Lifecycle)
	releasetest.AssertLifecycleRules(t, rel.Manifest)

	// And what the API server holds.
	d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, "native-ccm-oci-upstream", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := d.Annotations["example.com/chart-version"]; v != "1.1.0" {
		t.Errorf("deployment from chart version %q, want 1.1.0", v)
	}
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	args := append(slices.Clone(c.Command), c.Args...)
	for _, want := range []string{"--controllers=cloud-node-lifecycle", "--use-service-account-credentials=false", "--leader-elect-resource-name=native-ccm-oci", "--secure-port=" + fmt.Sprint(req.Lifecycle.SecurePort)} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	if slices.Contains(args, "--controllers=*") || slices.Contains(args, "--secure-port=10258") {
		t.Errorf("upstream flags survived: %v", args)
	}
	if spec.ServiceAccountName != "native-ccm-oci" || c.Image != req.Lifecycle.Image || c.Env[0].ValueFrom.SecretKeyRef.Name != "hcloud" {
		t.Errorf("sa=%s image=%s env=%+v", spec.ServiceAccountName, c.Image, c.Env)
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Get(ctx, "native-ccm-oci-cluster-admin", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("upstream cluster-admin binding was installed: %v", err)
	}
	if _, err := env.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "cloud-controller-manager", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("upstream ServiceAccount was installed: %v", err)
	}

	t.Run("cached by tag", func(t *testing.T) {
		// Re-pushing a tag with other content is not seen by an engine that
		// already pulled it (the request digest, made from the reference, does
		// not change either); a new engine (a restarted coordinator) pulls it.
		repushed := pushChart(t, push, host, "fake-ccm", "1.1.0", "b")
		if repushed.Manifest.Digest == pushed.Manifest.Digest {
			t.Fatal("re-push did not change the manifest")
		}
		if ociRequest(t, repository, "1.1.0", ns).Digest() != req.Digest() {
			t.Error("request digest changed with the registry's content")
		}
		n := len(reg.served("GET /v2/charts/fake-ccm/manifests/"))
		if _, err := e.Upgrade(ctx, req); err != nil {
			t.Fatal(err)
		}
		if got := len(reg.served("GET /v2/charts/fake-ccm/manifests/")); got != n {
			t.Errorf("engine went back to the registry for a cached tag (%d manifest GETs, had %d)", got, n)
		}
		d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, "native-ccm-oci-upstream", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if b := d.Annotations["example.com/build"]; b != "a" {
			t.Errorf("upgrade used build %q, want the cached a", b)
		}
		fresh := NewEngine(env.Config, Options{Timeout: time.Minute, HTTPClient: srv.Client()})
		ch, err := fresh.loadChart(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(ch.Templates[0].Data), `example.com/build: "b"`) {
			t.Errorf("a new engine did not pull the re-pushed tag")
		}
	})
}

// TestOCIChartPlainHTTP: TLS is the default; a registry without TLS is reached
// only with Options.RegistryPlainHTTP, and the default engine's failure names
// the reference.
func TestOCIChartPlainHTTP(t *testing.T) {
	hermeticHelm(t)
	srv := httptest.NewServer(newOCIRegistry())
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	push, err := registry.NewClient(registry.ClientOptPlainHTTP())
	if err != nil {
		t.Fatal(err)
	}
	pushChart(t, push, host, "fake-ccm", "1.0.0", "a")
	req := ociRequest(t, "oci://"+host+"/charts", "1.0.0", "ns")

	_, err = NewEngine(nil, Options{}).Render(context.Background(), req)
	t.Log(err)
	var ce *release.ChartError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), host+"/charts/fake-ccm:1.0.0") {
		t.Errorf("default (TLS) engine against a plain HTTP registry: err = %v", err)
	}
	out, err := NewEngine(nil, Options{RegistryPlainHTTP: true}).Render(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	releasetest.AssertLifecycleOnly(t, out, req.Lifecycle)
}
