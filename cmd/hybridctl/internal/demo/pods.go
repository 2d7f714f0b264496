package demo

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakelb"
	"github.com/hybrid-ccm/hybrid-ccm/test/podrunner"
)

// podArtifacts is what the native CCM pods run: the ccm-gate image, built from
// this checkout for this machine as `make images` builds it, and
// test/testccm, the stand-in for every upstream CCM image (built static: it
// runs in an otherwise empty root).
type podArtifacts struct {
	layout   string // OCI image layout holding gateRef
	gateRef  string
	testCCM  string
	cacheDir string
	cached   bool
}

// buildPodArtifacts builds the artifacts, or reuses them from
// ${XDG_CACHE_HOME:-~/.cache}/hybrid-ccm/demo/<key>, where key hashes every
// input of the two builds (the module's source files they compile, go.mod,
// go.sum, the Go version, the platform and the image reference). A build goes
// to a temporary directory renamed into place, so an interrupted build leaves
// nothing that a later run would take for complete.
func buildPodArtifacts(ctx context.Context, root string) (*podArtifacts, error) {
	version, err := ship.DefaultVersion(root)
	if err != nil {
		return nil, err
	}
	a := &podArtifacts{gateRef: ship.ImageRef(ship.DefaultRegistry, "ccm-gate", version)}
	key, err := sourceKey(ctx, root, a.gateRef)
	if err != nil {
		return nil, fmt.Errorf("hash the sources of ccm-gate and test/testccm: %w", err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return nil, err
	}
	base := filepath.Join(cache, "hybrid-ccm", "demo")
	a.cacheDir = filepath.Join(base, key)
	a.layout, a.testCCM = filepath.Join(a.cacheDir, "images"), filepath.Join(a.cacheDir, "testccm")
	if _, err := os.Stat(a.testCCM); err == nil {
		a.cached = true
		now := time.Now()
		_ = os.Chtimes(a.cacheDir, now, now) // last used, for pruneCache
		return a, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(base, "build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if _, err := ship.Build(ctx, ship.Options{Root: root, Version: version, Images: []string{"ccm-gate"},
		Platforms: []string{ship.HostPlatform()}, Out: filepath.Join(tmp, "images")}); err != nil {
		return nil, err
	}
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(tmp, "testccm"), "./test/testccm")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build test/testccm: %w\n%s", err, out)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, a.cacheDir); err != nil {
		// another demo built the same sources meanwhile: use its copy
		if _, serr := os.Stat(a.testCCM); serr != nil {
			return nil, err
		}
	}
	pruneCache(base, a.cacheDir)
	return a, nil
}

// pruneCache removes builds of other sources not used for a week.
func pruneCache(base, keep string) {
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		p := filepath.Join(base, e.Name())
		if p == keep || strings.HasPrefix(e.Name(), "build-") {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > 7*24*time.Hour {
			_ = os.RemoveAll(p)
		}
	}
}

// sourceKey hashes what the builds of ccm-gate and test/testccm read.
func sourceKey(ctx context.Context, root, gateRef string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{.Dir}}{{range .GoFiles}}	{{.}}{{end}}{{range .EmbedFiles}}	{{.}}{{end}}{{end}}{{end}}`,
		"./cmd/ccm-gate", "./test/testccm")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", runtime.Version(), ship.HostPlatform(), gateRef)
	files := []string{filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum")}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		for _, name := range f[1:] {
			files = append(files, filepath.Join(f[0], name))
		}
	}
	// the go command that builds, too (it may differ from this binary's)
	goVersion, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOVERSION: %w", err)
	}
	h.Write(goVersion)
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", strings.TrimPrefix(f, root), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:20], nil
}

// images resolves what the native CCM Deployments name: ccm-gate from the
// layout, the aws profile's upstream image to the real AWS CCM (awsCCM), every
// other built-in profile's to test/testccm.
func (a *podArtifacts) images(awsCCM string) (*podrunner.Images, error) {
	im, err := podrunner.LayoutImages(a.layout)
	if err != nil {
		return nil, err
	}
	set, err := profile.Builtin()
	if err != nil {
		return nil, err
	}
	for _, name := range set.Names() {
		p, _ := set.Get(name)
		bin := a.testCCM
		if name == "aws" {
			bin = awsCCM
		}
		im.Map(p.CCM.Image.Reference(), bin)
	}
	return im, nil
}

// awsCCMBinary is the upstream AWS CCM that hack/aws-ccm.sh built (`make
// demo` runs it first) for the version the aws profile's image names, found
// where the script caches it: ${HYBRID_CCM_CACHE:-${XDG_CACHE_HOME:-~/.cache}/hybrid-ccm}/aws-ccm-<tag>.
// The demo does not build it: it runs in a network namespace without the Go
// module proxy.
func awsCCMBinary() (string, error) {
	set, err := profile.Builtin()
	if err != nil {
		return "", err
	}
	p, ok := set.Get("aws")
	if !ok {
		return "", errors.New("no built-in aws profile")
	}
	root := os.Getenv("HYBRID_CCM_CACHE")
	if root == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		root = filepath.Join(cache, "hybrid-ccm")
	}
	bin := filepath.Join(root, "aws-ccm-"+p.CCM.Image.Tag, "aws-cloud-controller-manager")
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("the demo runs the upstream AWS CCM %s, built by hack/aws-ccm.sh, and %s is not there: run `make demo` (it builds it) or hack/aws-ccm.sh first", p.CCM.Image.Tag, bin)
	}
	return bin, nil
}

// cloudProviders maps each demo platform to the --cloud-provider name of its
// profile: what test/testccm sends the fake cloud as "provider".
func cloudProviders() (map[string]string, error) {
	set, err := profile.Builtin()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, d := range demoClouds {
		if d.platform == "aws" {
			continue // the real AWS CCM asks the fake EC2 (ec2.go)
		}
		p, ok := set.Get(d.platform)
		if !ok {
			return nil, fmt.Errorf("no built-in profile %q", d.platform)
		}
		out[p.CCM.CloudProvider] = d.platform
	}
	return out, nil
}

// fakeCloud is every test/testccm cloud's API (all but aws) as it asks it (GET
// ?provider=&node=&providerID= → {"exists", "shutdown"}), on loopback. Each
// cloud knows exactly its own platform's machines, as a real one would: asked
// about any other node it says "no such instance" — an ungated CCM would
// delete that node. The demo deletes a machine in it.
type fakeCloud struct {
	srv      *http.Server
	url      string
	platform map[string]string // provider name -> platform

	// lbs are the clouds' load balancers (test/testccm builds them there).
	lbs *fakelb.Cloud

	mu       sync.Mutex
	machines map[string]string // node name -> platform
	gone     map[string]bool
	asked    map[string]int // provider/node -> questions
	order    []string       // provider/node, first asked first
}

func startFakeCloud(providers map[string]string, nodes []simNode) (*fakeCloud, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &fakeCloud{platform: providers, machines: map[string]string{}, gone: map[string]bool{},
		asked: map[string]int{}, lbs: fakelb.New()}
	for _, n := range nodes {
		c.machines[n.name] = n.md.Platform
	}
	c.url = "http://" + l.Addr().String()
	c.srv = &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = c.srv.Serve(l) }()
	return c, nil
}

func (c *fakeCloud) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return c.srv.Close()
	}
	return nil
}

func (c *fakeCloud) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, fakelb.Prefix) {
		c.lbs.ServeHTTP(w, r)
		return
	}
	provider, node := r.URL.Query().Get("provider"), r.URL.Query().Get("node")
	c.mu.Lock()
	key := provider + "/" + node
	if c.asked[key] == 0 {
		c.order = append(c.order, key)
	}
	c.asked[key]++
	mine := c.platform[provider] != "" && c.machines[node] == c.platform[provider]
	exists, shutdown := mine && !c.gone[node], false
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]bool{"exists": exists, "shutdown": shutdown})
}

// deleteServer makes the machine of node vanish from its cloud.
func (c *fakeCloud) deleteServer(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone[node] = true
}

// cloudQuestion is what one cloud was asked about one node, and how often.
type cloudQuestion struct {
	Provider, Node string
	Times          int
}

func (c *fakeCloud) questions() []cloudQuestion {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]cloudQuestion, 0, len(c.order))
	for _, k := range c.order {
		p, n, _ := strings.Cut(k, "/")
		out = append(out, cloudQuestion{Provider: p, Node: n, Times: c.asked[k]})
	}
	return out
}

// podLog keeps the containers' output in a file and its tail in memory (for
// an error message).
type podLog struct {
	mu   sync.Mutex
	f    *os.File
	tail []byte
}

func (l *podLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tail = append(l.tail, p...)
	if len(l.tail) > 64*1024 {
		l.tail = slices.Clone(l.tail[len(l.tail)-32*1024:])
	}
	if l.f != nil {
		return l.f.Write(p)
	}
	return len(p), nil
}

func (l *podLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.tail)
}

var _ io.Writer = (*podLog)(nil)
