// Package fleethelm installs and upgrades charts from a fleet's registry with
// Helm's own SDK, as a user's `helm install`/`helm upgrade` does. Apart from
// test/fleet: the demo links test/fleet, and only coordinator/release/helm may
// link Helm in the product's binaries.
package fleethelm

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/kube"
	helmregistry "helm.sh/helm/v3/pkg/registry"
	helmrelease "helm.sh/helm/v3/pkg/release"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
)

// Install is `helm install release ref --version version -n namespace
// --values values` with Helm's own SDK, the chart pulled from the fleet's
// registry (ref: f.ChartRef).
func Install(ctx context.Context, f *fleet.Fleet, namespace, release, ref, version string, values map[string]any) error {
	cfg, settings, err := config(f, namespace)
	if err != nil {
		return err
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.Version = release, namespace, version
	ch, err := locate(&in.ChartPathOptions, settings, ref)
	if err != nil {
		return err
	}
	if _, err := in.RunWithContext(ctx, ch, values); err != nil {
		return fmt.Errorf("helm install %s %s --version %s: %w", release, ref, version, err)
	}
	return nil
}

// Upgrade is `helm upgrade release ref --version version -n namespace
// --values values` (no --wait: what the upgrade starts, the cluster
// finishes). It returns the chart it pulled: its crds/ are the caller's to
// apply, as docs/install.md says (Helm never updates them).
func Upgrade(ctx context.Context, f *fleet.Fleet, namespace, release, ref, version string, values map[string]any) (*chart.Chart, error) {
	cfg, settings, err := config(f, namespace)
	if err != nil {
		return nil, err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Version = namespace, version
	ch, err := locate(&up.ChartPathOptions, settings, ref)
	if err != nil {
		return nil, err
	}
	if _, err := up.RunWithContext(ctx, release, ch, values); err != nil {
		return nil, fmt.Errorf("helm upgrade %s %s --version %s: %w", release, ref, version, err)
	}
	return ch, nil
}

// InstallChart is `helm install release <dir> -n namespace --values values`
// of a chart directory on this machine (an upstream chart as its source
// ships it), with Helm's own SDK.
func InstallChart(ctx context.Context, f *fleet.Fleet, namespace, release, dir string, values map[string]any) error {
	cfg, _, err := config(f, namespace)
	if err != nil {
		return err
	}
	ch, err := loader.Load(dir)
	if err != nil {
		return fmt.Errorf("helm install %s %s: %w", release, dir, err)
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = release, namespace
	if _, err := in.RunWithContext(ctx, ch, values); err != nil {
		return fmt.Errorf("helm install %s %s: %w", release, dir, err)
	}
	return nil
}

// Uninstall is `helm uninstall release -n namespace` with Helm's own SDK:
// the release's objects are deleted (their pods then stop as the cluster
// stops them) and its history removed.
func Uninstall(f *fleet.Fleet, namespace, release string) error {
	cfg, _, err := config(f, namespace)
	if err != nil {
		return err
	}
	if _, err := action.NewUninstall(cfg).Run(release); err != nil {
		return fmt.Errorf("helm uninstall %s -n %s: %w", release, namespace, err)
	}
	return nil
}

// FieldManager is the field manager Install and Upgrade write with: the
// helm CLI's.
const FieldManager = "helm"

// config is Helm's configuration for namespace: releases stored in Secrets,
// the registry client trusting the fleet's registry (and logged in to it
// when its release repositories are private).
func config(f *fleet.Fleet, namespace string) (*action.Configuration, *cli.EnvSettings, error) {
	// The field manager of what Helm writes, as the helm CLI names it (Helm
	// takes its binary's name; a test binary's would be adopt.test).
	kube.ManagedFieldsManager = FieldManager
	kubeconfig, ns := f.KubeconfigPath, namespace
	cfg := &action.Configuration{}
	if err := cfg.Init(&genericclioptions.ConfigFlags{KubeConfig: &kubeconfig, Namespace: &ns}, namespace, "secret", func(string, ...any) {}); err != nil {
		return nil, nil, err
	}
	opts := []helmregistry.ClientOption{helmregistry.ClientOptHTTPClient(f.Registry.HTTPClient())}
	if c, ok := f.Registry.Credentials(); ok {
		// `helm registry login` to a private registry
		opts = append(opts, helmregistry.ClientOptBasicAuth(c.Username, c.Password))
	}
	rc, err := helmregistry.NewClient(opts...)
	if err != nil {
		return nil, nil, err
	}
	cfg.RegistryClient = rc
	settings := cli.New()
	settings.RepositoryCache = filepath.Join(f.Work(), "helm-cache")
	return cfg, settings, nil
}

// locate pulls the chart ref at the options' version and loads it.
func locate(o *action.ChartPathOptions, settings *cli.EnvSettings, ref string) (*chart.Chart, error) {
	path, err := o.LocateChart(ref, settings)
	if err != nil {
		return nil, fmt.Errorf("helm pull %s --version %s: %w", ref, o.Version, err)
	}
	ch, err := loader.Load(path)
	if err != nil {
		return nil, fmt.Errorf("helm pull %s --version %s: %w", ref, o.Version, err)
	}
	return ch, nil
}

// Status is `helm status release -n namespace`: the release as Helm last
// recorded it.
func Status(f *fleet.Fleet, namespace, release string) (*helmrelease.Release, error) {
	cfg, _, err := config(f, namespace)
	if err != nil {
		return nil, err
	}
	rel, err := action.NewStatus(cfg).Run(release)
	if err != nil {
		return nil, fmt.Errorf("helm status %s -n %s: %w", release, namespace, err)
	}
	return rel, nil
}

// Test is `helm test release -n namespace --logs [--filter name=...]`:
// it runs the release's test hooks (only those named, when names are
// given) and returns their pods' logs, as the helm CLI prints them, with
// the error of the first test that failed.
func Test(f *fleet.Fleet, namespace, release string, timeout time.Duration, names ...string) (string, error) {
	cfg, _, err := config(f, namespace)
	if err != nil {
		return "", err
	}
	rt := action.NewReleaseTesting(cfg)
	rt.Namespace, rt.Timeout = namespace, timeout
	if len(names) > 0 {
		rt.Filters = map[string][]string{action.IncludeNameFilter: names}
	}
	rel, runErr := rt.Run(release)
	if runErr != nil {
		runErr = fmt.Errorf("helm test %s -n %s: %w", release, namespace, runErr)
	}
	var logs strings.Builder
	if rel != nil {
		if err := rt.GetPodLogs(&logs, rel); err != nil && runErr == nil {
			return logs.String(), fmt.Errorf("helm test %s -n %s --logs: %w", release, namespace, err)
		}
	}
	return logs.String(), runErr
}
