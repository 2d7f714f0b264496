package podrunner

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options configure a Runner.
type Options struct {
	// Config is an admin rest.Config of the API server the pods report to; its
	// host must be on loopback (containers reach it as KUBERNETES_SERVICE_HOST).
	Config *rest.Config
	// Images resolves the pods' image references.
	Images *Images
	// NodeName is the pods' spec.nodeName; default "podrunner". No Node object
	// is created.
	NodeName string
	// Dir holds the pods' root file systems and volumes; default a temporary
	// directory removed by Stop.
	Dir string
	// Log receives every container's output, each line prefixed with
	// "namespace/pod/container: ". New defaults it to tb.Log.
	Log io.Writer
	// BackOff is the first crash-loop back-off, doubled per restart up to
	// MaxBackOff; defaults 100ms and 2s (the kubelet's are 10s and 5m).
	BackOff, MaxBackOff time.Duration
	// MaxProbePeriod, when set, caps every probe's periodSeconds and
	// initialDelaySeconds, so that probes written for clusters run quickly.
	MaxProbePeriod time.Duration
	// MaxGracePeriod caps terminationGracePeriodSeconds; default 5s.
	MaxGracePeriod time.Duration
	// SyncPeriod is how often pods and Deployments are re-read and their
	// status re-derived; default 500ms.
	SyncPeriod time.Duration
}

// Runner runs Deployments' pods as local processes and reports them like a
// kubelet and the deployment controller would.
type Runner struct {
	opts   Options
	client kubernetes.Interface
	// apiHost and apiPort are the API server as containers see it.
	apiHost, apiPort string
	caData           []byte

	ctx    context.Context
	cancel context.CancelFunc
	ownDir bool

	mu          sync.Mutex
	deployments map[string]*Deployment
	managers    []func()
	wg          sync.WaitGroup
	stopOnce    sync.Once
}

// TB is the part of testing.TB that New uses (*testing.T and *testing.B
// have it). hybridctl demo links this package, which must therefore not
// import testing.
type TB interface {
	Helper()
	Log(args ...any)
	Fatal(args ...any)
	Cleanup(func())
}

// New is Start for tests: it fails tb on bad options, logs container output
// with tb.Log unless opts.Log is set, and stops everything in tb.Cleanup.
func New(tb TB, opts Options) *Runner {
	tb.Helper()
	if opts.Log == nil {
		opts.Log = tbWriter{tb}
	}
	r, err := Start(context.Background(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Stop)
	return r
}

// Start returns a Runner that runs nothing yet. Stop it when done (or cancel
// ctx and then Stop).
func Start(ctx context.Context, opts Options) (*Runner, error) {
	if opts.Config == nil {
		return nil, fmt.Errorf("podrunner: Options.Config is required")
	}
	if opts.NodeName == "" {
		opts.NodeName = "podrunner"
	}
	if opts.BackOff <= 0 {
		opts.BackOff = 100 * time.Millisecond
	}
	if opts.MaxBackOff < opts.BackOff {
		opts.MaxBackOff = max(2*time.Second, opts.BackOff)
	}
	if opts.MaxGracePeriod <= 0 {
		opts.MaxGracePeriod = 5 * time.Second
	}
	if opts.SyncPeriod <= 0 {
		opts.SyncPeriod = 500 * time.Millisecond
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	u, err := url.Parse(opts.Config.Host)
	if err != nil || u.Host == "" {
		if u, err = url.Parse("https://" + opts.Config.Host); err != nil {
			return nil, fmt.Errorf("podrunner: API server host %q: %w", opts.Config.Host, err)
		}
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "443"
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("podrunner: API server %s is not on loopback, containers could not reach it", opts.Config.Host)
	}
	ca := opts.Config.CAData
	if len(ca) == 0 && opts.Config.CAFile != "" {
		if ca, err = os.ReadFile(opts.Config.CAFile); err != nil {
			return nil, fmt.Errorf("podrunner: API server CA: %w", err)
		}
	}
	cs, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("podrunner: %w", err)
	}
	r := &Runner{opts: opts, client: cs, apiHost: host, apiPort: port, caData: ca, deployments: map[string]*Deployment{}}
	if r.opts.Dir == "" {
		if r.opts.Dir, err = os.MkdirTemp("", "podrunner-"); err != nil {
			return nil, err
		}
		r.ownDir = true
	}
	r.ctx, r.cancel = context.WithCancel(ctx)
	return r, nil
}

// Stop stops every pod (SIGTERM, grace period, SIGKILL; app containers
// before sidecars), deletes their Pod objects and removes the runner's files.
// Deployments, ReplicaSets and their status stay as they are.
func (r *Runner) Stop() {
	r.stopOnce.Do(func() {
		r.cancel()
		r.wg.Wait()
		if r.ownDir {
			_ = os.RemoveAll(r.opts.Dir)
		}
	})
}

func (r *Runner) go_(f func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// tbWriter logs each line with tb.Log.
type tbWriter struct{ tb TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// lineWriter writes whole lines with a prefix to out.
type lineWriter struct {
	mu     sync.Mutex
	prefix string
	out    io.Writer
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		_, _ = fmt.Fprintf(w.out, "%s%s\n", w.prefix, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// flush writes a last line without newline.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		_, _ = fmt.Fprintf(w.out, "%s%s\n", w.prefix, w.buf)
		w.buf = nil
	}
}

// logBuffer keeps a container's output across restarts.
type logBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// tail is the end of the log the kubelet uses with FallbackToLogsOnError:
// at most 80 lines and 2048 bytes, from offset on.
func (l *logBuffer) tail(offset int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.b[min(offset, len(l.b)):]
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	return strings.Join(lines, "\n")
}
