// Package helm owns Helm: it installs, upgrades, rolls back and uninstalls
// native CCM releases with the helm.sh/helm/v3 action SDK (history in Secrets),
// loads charts (embedded generic chart, HTTP chart repositories, OCI registries)
// and runs every rendered manifest through the request's mutators
// (coordinator/release) as a post-renderer.
//
// It runs one action per call and neither decides which action to run nor
// records status: that is the controller's job. No other package imports Helm
// (cmd/ccm-coordinator wires it in); what a release is lives in the Helm-free
// coordinator/release.
package helm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"
	helmrelease "helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// Options tune the engine.
type Options struct {
	// Wait makes install/upgrade/rollback wait for the workload to be ready.
	Wait bool
	// Timeout of each Helm action (and of Wait).
	Timeout time.Duration
	// MaxHistory is the number of revisions kept per release.
	MaxHistory int
	// HTTPClient fetches HTTP chart repositories; default http.DefaultClient.
	HTTPClient *http.Client
	// RegistryPlainHTTP talks to OCI registries without TLS (local registries).
	RegistryPlainHTTP bool
	// Log receives Helm's debug output at V(4).
	Log logr.Logger
	// BuiltinChartVersion, when set, is the version and appVersion of the
	// embedded native-ccm chart (BuiltinChart): the coordinator's release.
	BuiltinChartVersion string
}

// Engine runs Helm actions against one cluster.
type Engine struct {
	rest   *rest.Config
	opts   Options
	charts *chartSource

	mu      sync.Mutex
	configs map[string]*action.Configuration
}

// NewEngine returns an engine that talks to the cluster of cfg.
func NewEngine(cfg *rest.Config, opts Options) *Engine {
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Minute
	}
	if opts.MaxHistory == 0 {
		opts.MaxHistory = 5
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = http.DefaultClient
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	e := &Engine{rest: cfg, opts: opts, configs: map[string]*action.Configuration{}}
	e.charts = &chartSource{builtinVersion: opts.BuiltinChartVersion, http: opts.HTTPClient, registry: e.registryClient}
	return e
}

func (e *Engine) registryClient() (*registry.Client, error) {
	opts := []registry.ClientOption{registry.ClientOptHTTPClient(e.opts.HTTPClient)}
	if e.opts.RegistryPlainHTTP {
		opts = append(opts, registry.ClientOptPlainHTTP())
	}
	return registry.NewClient(opts...)
}

// config returns the action configuration of a namespace (created once: it
// caches discovery and capabilities).
func (e *Engine) config(namespace string) (*action.Configuration, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.configs[namespace]; ok {
		return c, nil
	}
	c := &action.Configuration{}
	log := e.opts.Log.WithValues("namespace", namespace)
	if err := c.Init(newClusterAccess(e.rest, namespace), namespace, "secret", func(format string, v ...any) {
		log.V(4).Info(fmt.Sprintf(format, v...))
	}); err != nil {
		return nil, fmt.Errorf("helm configuration for namespace %s: %w", namespace, err)
	}
	e.configs[namespace] = c
	return c, nil
}

// Get returns the latest revision of a release, or nil when there is none.
func (e *Engine) Get(_ context.Context, namespace, name string) (*release.Info, error) {
	const op = "helm/Engine.Get"
	cfg, err := e.config(namespace)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	hist, err := cfg.Releases.History(name)
	if errors.Is(err, driver.ErrReleaseNotFound) || (err == nil && len(hist) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %s/%s: %w", op, namespace, name, err)
	}
	var latest *helmrelease.Release
	info := &release.Info{}
	for _, r := range hist {
		if latest == nil || r.Version > latest.Version {
			latest = r
		}
		if (r.Info.Status == helmrelease.StatusDeployed || r.Info.Status == helmrelease.StatusSuperseded) && r.Version > info.LastDeployed {
			info.LastDeployed = r.Version
		}
	}
	fill(info, latest)
	return info, nil
}

func fill(info *release.Info, r *helmrelease.Release) {
	info.Name, info.Namespace, info.Revision = r.Name, r.Namespace, r.Version
	if r.Info != nil {
		info.Status = r.Info.Status.String()
	}
	if r.Chart != nil && r.Chart.Metadata != nil {
		info.Chart = r.Chart.Metadata.Name + "@" + r.Chart.Metadata.Version
	}
	info.Digest = r.Labels[release.DigestLabel]
}

func (e *Engine) loadChart(ctx context.Context, req release.Request) (*chart.Chart, error) {
	ch, err := e.charts.load(ctx, req.Chart)
	if err != nil {
		return nil, &release.ChartError{Err: err}
	}
	return ch, nil
}

// prepare returns the Helm configuration of the request's namespace and its
// chart, what an install and an upgrade both start from.
func (e *Engine) prepare(ctx context.Context, req release.Request) (*action.Configuration, *chart.Chart, error) {
	cfg, err := e.config(req.Namespace)
	if err != nil {
		return nil, nil, err
	}
	ch, err := e.loadChart(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	return cfg, ch, nil
}

// Install installs revision 1 of the release.
func (e *Engine) Install(ctx context.Context, req release.Request) (*release.Info, error) {
	const op = "helm/Engine.Install"
	cfg, ch, err := e.prepare(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = req.Name, req.Namespace
	in.Wait, in.Timeout = e.opts.Wait, e.opts.Timeout
	in.PostRenderer = postRenderer{req: req}
	in.Labels = map[string]string{release.DigestLabel: req.Digest()}
	in.Description = "installed by ccm-coordinator"
	rel, err := in.RunWithContext(ctx, ch, req.Values)
	if err != nil {
		if strings.Contains(err.Error(), nameInUse) {
			err = fmt.Errorf("%w: %v", release.ErrNameInUse, err)
		}
		return e.infoAfter(ctx, req, fmt.Errorf("%s: %s/%s: %w", op, req.Namespace, req.Name, err))
	}
	info := &release.Info{LastDeployed: rel.Version}
	fill(info, rel)
	return info, nil
}

// nameInUse is what Helm's install says when the release already exists.
const nameInUse = "cannot re-use a name that is still in use"

// Upgrade makes a new revision of an existing release.
func (e *Engine) Upgrade(ctx context.Context, req release.Request) (*release.Info, error) {
	const op = "helm/Engine.Upgrade"
	cfg, ch, err := e.prepare(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = req.Namespace
	up.Wait, up.Timeout = e.opts.Wait, e.opts.Timeout
	up.MaxHistory = e.opts.MaxHistory
	up.PostRenderer = postRenderer{req: req}
	up.Labels = map[string]string{release.DigestLabel: req.Digest()}
	up.Description = "upgraded by ccm-coordinator"
	// Values are the complete desired state, never merged with earlier ones.
	up.ResetValues = true
	rel, err := up.RunWithContext(ctx, req.Name, ch, req.Values)
	if err != nil {
		return e.infoAfter(ctx, req, fmt.Errorf("%s: %s/%s: %w", op, req.Namespace, req.Name, err))
	}
	info := &release.Info{LastDeployed: rel.Version}
	fill(info, rel)
	return info, nil
}

// infoAfter returns the release state after a failed action with the error.
func (e *Engine) infoAfter(ctx context.Context, req release.Request, err error) (*release.Info, error) {
	info, gerr := e.Get(ctx, req.Namespace, req.Name)
	if gerr != nil {
		return nil, errors.Join(err, gerr)
	}
	return info, err
}

// Rollback returns the release to its newest successfully deployed revision.
func (e *Engine) Rollback(ctx context.Context, namespace, name string) (*release.Info, error) {
	const op = "helm/Engine.Rollback"
	cfg, err := e.config(namespace)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	info, err := e.Get(ctx, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if info == nil || info.LastDeployed == 0 {
		return info, fmt.Errorf("%s: %s/%s has no deployed revision to roll back to", op, namespace, name)
	}
	rb := action.NewRollback(cfg)
	rb.Version = info.LastDeployed
	rb.Wait, rb.Timeout = e.opts.Wait, e.opts.Timeout
	rb.MaxHistory = e.opts.MaxHistory
	if err := rb.Run(name); err != nil {
		return e.infoAfter(ctx, release.Request{Namespace: namespace, Name: name}, fmt.Errorf("%s: %s/%s to revision %d: %w", op, namespace, name, info.LastDeployed, err))
	}
	return e.Get(ctx, namespace, name)
}

// Uninstall removes the release and its history. A missing release is not an error.
func (e *Engine) Uninstall(_ context.Context, namespace, name string) error {
	const op = "helm/Engine.Uninstall"
	cfg, err := e.config(namespace)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	un := action.NewUninstall(cfg)
	un.Wait, un.Timeout = e.opts.Wait, e.opts.Timeout
	un.IgnoreNotFound = true
	un.DeletionPropagation = "background"
	if _, err := un.Run(name); err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
		return fmt.Errorf("%s: %s/%s: %w", op, namespace, name, err)
	}
	return nil
}

// Unlock marks a release stuck in a pending state (an operation interrupted by
// a restart) as failed, so that the next action can proceed.
func (e *Engine) Unlock(_ context.Context, namespace, name string) error {
	const op = "helm/Engine.Unlock"
	cfg, err := e.config(namespace)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	last, err := cfg.Releases.Last(name)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if !last.Info.Status.IsPending() {
		return nil
	}
	last.SetStatus(helmrelease.StatusFailed, "interrupted; marked failed by ccm-coordinator")
	if err := cfg.Releases.Update(last); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// Render returns the manifests a request would install, after every mutator,
// without talking to a cluster.
func (e *Engine) Render(ctx context.Context, req release.Request) (string, error) {
	const op = "helm/Engine.Render"
	ch, err := e.loadChart(ctx, req)
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	cfg := &action.Configuration{Log: func(string, ...any) {}}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = req.Name, req.Namespace
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.KubeVersion = &chartutil.KubeVersion{Version: "v1.36.0", Major: "1", Minor: "36"} // the oldest supported minor (docs/install.md)
	in.PostRenderer = postRenderer{req: req}
	rel, err := in.RunWithContext(ctx, ch, req.Values)
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	return rel.Manifest, nil
}
