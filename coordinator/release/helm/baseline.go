package helm

import (
	"context"
	"fmt"
	"maps"

	"helm.sh/helm/v3/pkg/action"
	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// PlainInstall does what `helm install` does with a request's chart and values:
// a fresh Helm configuration (discovery included), no post-renderer, no wait,
// history in Secrets. Benchmarks use it as the baseline for Engine.Install.
//
// For the builtin chart, the chart renders the ServiceAccount and RBAC itself
// (its standalone mode), so both sides create the same set of objects.
func PlainInstall(ctx context.Context, cfg *rest.Config, req release.Request) error {
	const op = "helm.PlainInstall"
	ch, err := (&chartSource{}).load(ctx, req.Chart)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	values := req.Values
	if req.Chart.Source == "builtin" {
		values = maps.Clone(req.Values) // the request keeps its own
		values["serviceAccount"] = map[string]any{"create": true, "name": req.Name}
		values["rbac"] = map[string]any{"create": true}
	}
	ac := &action.Configuration{}
	if err := ac.Init(newClusterAccess(cfg, req.Namespace), req.Namespace, "secret", func(string, ...any) {}); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	in := action.NewInstall(ac)
	in.ReleaseName, in.Namespace = req.Name, req.Namespace
	if _, err := in.RunWithContext(ctx, ch, values); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}
