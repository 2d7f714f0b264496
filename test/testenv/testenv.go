// Package testenv starts the real control plane (kube-apiserver + etcd built by
// hack/control-plane.sh) for integration tests and for `hybridctl demo`
// through controller-runtime's envtest.
//
// It owns only process start/stop and client construction; it never fakes API
// behaviour. Binaries come from KUBEBUILDER_ASSETS, which `make test` exports.
// hybridctl links it: it must not import testing (the test in cmd/hybridctl
// checks); Run takes a *testing.M as the one method it calls.
package testenv

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/repo"
)

// Env is a running control plane.
type Env struct {
	env *envtest.Environment
	// certDir is the API server's certificate directory when it is kept
	// across restarts (Options.Restartable); removed by Stop.
	certDir string
	// Config is an admin rest.Config for the API server.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	// KubeconfigPath is an admin kubeconfig file usable by subprocesses.
	KubeconfigPath string
}

// Options tune the control plane.
type Options struct {
	// CRDDirectoryPaths are installed before Start returns.
	CRDDirectoryPaths []string
	// APIServerFlags are set on kube-apiserver (name without dashes, value),
	// replacing envtest's, e.g. a wider service-cluster-ip-range for
	// thousands of Services.
	APIServerFlags map[string]string
	// Restartable keeps the API server's serving certificate, keys and port
	// across RestartAPIServer, so that every client made before a restart
	// works after it.
	Restartable bool
}

// RepoRoot returns the repository root (the directory holding go.mod): where
// this file was compiled from or, in a build with -trimpath (make test builds
// everything with the release's flags, hack/test.sh), the nearest go.mod at
// or above the working directory (repo.Root: go test runs a package's tests
// in its directory). It is "." when neither is known.
func RepoRoot() string {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	}
	if root, err := repo.Root(); err == nil {
		return root
	}
	return "."
}

// AssetsDir returns KUBEBUILDER_ASSETS or an error that says how to get it.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "", fmt.Errorf("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/control-plane.sh)")
	}
	if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); err != nil {
		return "", fmt.Errorf("KUBEBUILDER_ASSETS=%s has no kube-apiserver: %w", dir, err)
	}
	return dir, nil
}

// Start starts kube-apiserver and etcd. Call Stop when done.
func Start(opts Options) (*Env, error) {
	dir, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	e := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     opts.CRDDirectoryPaths,
		ErrorIfCRDPathMissing: len(opts.CRDDirectoryPaths) > 0,
		// envtest waits 20 s for each daemon to report healthy and 10 s for
		// the CRDs to be established; with both lanes of make test on two
		// cores an API server can take longer. Waits, not assertions: the
		// suite goes on as soon as each reports ready.
		ControlPlaneStartTimeout: 2 * time.Minute,
		CRDInstallOptions:        envtest.CRDInstallOptions{MaxTime: time.Minute},
	}
	// Without it kube-apiserver derives its advertised address from the
	// default route, which a test's own network namespace (test/netns) lacks.
	e.ControlPlane.GetAPIServer().Configure().Set("advertise-address", "127.0.0.1")
	// A loopback address cannot be the kubernetes Service's endpoint: up to 1.36
	// the endpoint reconciler's writes of it failed (and the Service had no
	// endpoints), from 1.37 kube-apiserver refuses to start with it. Without a
	// reconciler the Service has no endpoints, as before, and the API server starts.
	e.ControlPlane.GetAPIServer().Configure().Set("endpoint-reconciler-type", "none")
	for k, v := range opts.APIServerFlags {
		e.ControlPlane.GetAPIServer().Configure().Set(k, v)
	}
	var certDir string
	if opts.Restartable {
		// A directory envtest did not make is one it neither empties nor
		// replaces when the API server stops.
		if certDir, err = os.MkdirTemp("", "hybrid-ccm-apiserver-*"); err != nil {
			return nil, err
		}
		e.ControlPlane.GetAPIServer().CertDir = certDir
	}
	cfg, err := e.Start()
	if err != nil {
		// whatever started (etcd, often) must not outlive the test
		_ = e.Stop()
		_ = os.RemoveAll(certDir)
		return nil, fmt.Errorf("start control plane from %s: %w", dir, err)
	}
	cfg.QPS, cfg.Burst = -1, -1 // tests measure the server, not a client-side limiter
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		_ = e.Stop()
		return nil, err
	}
	kc, err := os.CreateTemp("", "hybrid-ccm-kubeconfig-*")
	if err != nil {
		_ = e.Stop()
		return nil, err
	}
	if _, err := kc.Write(e.KubeConfig); err != nil {
		_ = e.Stop()
		return nil, err
	}
	_ = kc.Close()
	env := &Env{env: e, certDir: certDir, Config: cfg, Client: cs, KubeconfigPath: kc.Name()}
	stopOnSignal(env)
	return env, nil
}

var (
	running   = map[*Env]bool{}
	runningMu sync.Mutex
	watchOnce sync.Once
)

// stopOnSignal stops env when the test process gets SIGINT or SIGTERM (a
// go test interrupted, a CI job cancelled) before Stop: etcd and
// kube-apiserver are processes of their own and would outlive it. After
// stopping every running Env it hands the signal on: to the other handlers
// of the process (test/cluster's), or to the default action.
func stopOnSignal(env *Env) {
	runningMu.Lock()
	running[env] = true
	runningMu.Unlock()
	watchOnce.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		go func() {
			sig := <-ch
			runningMu.Lock()
			for e := range running {
				_ = e.stop()
			}
			running = map[*Env]bool{}
			runningMu.Unlock()
			signal.Stop(ch)
			if s, ok := sig.(syscall.Signal); ok {
				_ = syscall.Kill(os.Getpid(), s)
			}
		}()
	})
}

// RestartAPIServer stops kube-apiserver (etcd keeps running), calls down
// while it is stopped (nil: nothing), and starts it again with the same
// flags, certificates and port; it returns once the API server reports
// healthy. It needs Options.Restartable.
func (e *Env) RestartAPIServer(down func()) error {
	if e.certDir == "" {
		return fmt.Errorf("testenv: RestartAPIServer needs Options.Restartable")
	}
	s := e.env.ControlPlane.GetAPIServer()
	if err := s.Stop(); err != nil {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	if down != nil {
		down()
	}
	if err := s.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver again: %w", err)
	}
	return nil
}

// Stop stops the control plane and removes temporary files.
func (e *Env) Stop() error {
	if e == nil {
		return nil
	}
	runningMu.Lock()
	delete(running, e)
	runningMu.Unlock()
	return e.stop()
}

func (e *Env) stop() error {
	_ = os.Remove(e.KubeconfigPath)
	err := e.env.Stop()
	if e.certDir != "" {
		_ = os.RemoveAll(e.certDir)
	}
	return err
}

// AddUser creates an authenticated user (client certificate) and returns its rest.Config.
// Authorization is up to the caller (RBAC objects).
func (e *Env) AddUser(name string, groups ...string) (*rest.Config, error) {
	u, err := e.env.ControlPlane.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}

// Tests is what Run needs of a *testing.M.
type Tests interface{ Run() int }

// Run is a TestMain helper: it starts one control plane for the package, runs the
// tests (m is the *testing.M) and stops it. The started Env is passed to setup.
func Run(m Tests, opts Options, setup func(*Env)) int {
	if FuzzingRequested() {
		// No control plane for fuzzing: fuzz targets do not use one, and a
		// fuzz worker that is stopped at the end of the run (killed when it
		// does not exit at once) would leave its etcd running, holding the
		// pipes the worker inherited from go test, which then waits for
		// them forever. setup is not called; tests that need the control
		// plane skip.
		return m.Run()
	}
	env, err := Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	setup(env)
	return m.Run()
}

// BenchmarksRequested reports whether `go test -bench` selected benchmarks. A
// benchmark-only package's TestMain uses it to skip starting a control plane
// when it runs as part of `go test ./...`.
func BenchmarksRequested() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.bench")
	return f != nil && f.Value.String() != ""
}

// FuzzingRequested reports whether this test binary runs for `go test -fuzz`:
// as the fuzzing coordinator or as one of its workers.
func FuzzingRequested() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	for _, name := range []string{"test.fuzz", "test.fuzzworker"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			return true
		}
	}
	return false
}
