// Package chartstest holds what the chart tests (charts/test) and the GitOps
// tests (gitops) share to check rendered charts against a real API server: one
// control plane per test binary with the CRDs a cluster running the charts has,
// server-side apply (dry-run or not) of rendered objects, and the parsing of a
// rendered manifest.
//
// It is test support: nothing outside tests imports it.
package chartstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// CRDDirectoryPaths are the CRDs the charts' objects need: the NativeCCM CRD
// of charts/ccm-coordinator, and charts/test/testdata/crds, the stand-in for
// the CRD Talos itself installs for its talos.dev ServiceAccount kind (the
// test API server is not a Talos cluster).
func CRDDirectoryPaths() []string {
	root := testenv.RepoRoot()
	return []string{
		filepath.Join(root, "charts", "ccm-coordinator", "crds"),
		filepath.Join(root, "charts", "test", "testdata", "crds"),
	}
}

// ControlPlane is the real kube-apiserver + etcd of a test binary, started on
// first use with CRDDirectoryPaths. The zero value is ready; call Stop from
// TestMain.
type ControlPlane struct {
	once sync.Once
	env  *testenv.Env
	err  error
}

// Env starts the control plane once and returns it, or fails the test.
func (c *ControlPlane) Env(t testing.TB) *testenv.Env {
	t.Helper()
	c.once.Do(func() {
		c.env, c.err = testenv.Start(testenv.Options{CRDDirectoryPaths: CRDDirectoryPaths()})
	})
	if c.err != nil {
		t.Fatal(c.err)
	}
	return c.env
}

// Stop stops the control plane if it was started.
func (c *ControlPlane) Stop() {
	if c.env != nil {
		_ = c.env.Stop()
	}
}

// Applier sends objects to the API server with server-side apply.
type Applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	// namespace is where a namespaced object without a namespace goes: the
	// release namespace (helm install -n <namespace>).
	namespace string
}

// NewApplier returns an Applier for env that puts namespaced objects without
// a namespace into namespace.
func NewApplier(t testing.TB, env *testenv.Env, namespace string) *Applier {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &Applier{
		dyn:       dyn,
		mapper:    restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(env.Client.Discovery())),
		namespace: namespace,
	}
}

// Apply server-side applies obj as Helm's field manager would; dryRun asks the
// API server to run everything (defaulting, schema and CEL validation,
// admission) without persisting.
func (a *Applier) Apply(ctx context.Context, obj *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	opts := metav1.ApplyOptions{FieldManager: "helm", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == "namespace" {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = a.namespace
		}
		ri = a.dyn.Resource(mapping.Resource).Namespace(ns)
	}
	out, err := ri.Apply(ctx, obj.GetName(), obj, opts)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	return out, nil
}

// Parse splits a rendered manifest (Helm's release manifest, `helm template`
// output) into its objects, in order; empty documents are left out.
func Parse(manifest string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(obj) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
}

// Umbrella loads charts/hybrid-ccm with its file:// dependencies loaded from
// the repository, in memory (the published OCI artifact carries them the
// same way), or fails the test.
func Umbrella(tb testing.TB) *chart.Chart {
	tb.Helper()
	dir := filepath.Join(testenv.RepoRoot(), "charts", "hybrid-ccm")
	ch, err := loader.LoadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var deps []*chart.Chart
	for _, d := range ch.Metadata.Dependencies {
		if !strings.HasPrefix(d.Repository, "file://") {
			tb.Fatalf("dependency %s from %s: not a chart of this repository", d.Name, d.Repository)
		}
		sub, err := loader.LoadDir(filepath.Join(dir, strings.TrimPrefix(d.Repository, "file://")))
		if err != nil {
			tb.Fatal(err)
		}
		deps = append(deps, sub)
	}
	ch.SetDependencies(deps...)
	return ch
}

// InstallUmbrella is `helm install <release> charts/hybrid-ccm -n <namespace>`
// through the Helm SDK against the API server of kubeconfig, with values.
func InstallUmbrella(tb testing.TB, ctx context.Context, kubeconfig, namespace, release string, values map[string]any) {
	tb.Helper()
	ns := namespace
	cfg := &action.Configuration{}
	if err := cfg.Init(&genericclioptions.ConfigFlags{KubeConfig: &kubeconfig, Namespace: &ns}, namespace, "secret", func(string, ...any) {}); err != nil {
		tb.Fatal(err)
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = release, namespace
	if _, err := in.RunWithContext(ctx, Umbrella(tb), values); err != nil {
		tb.Fatalf("helm install %s: %v", release, err)
	}
}

// NativeCCM reads the NativeCCM name from the API server of cfg (through the
// dynamic client, as kubectl would), or fails the test.
func NativeCCM(tb testing.TB, ctx context.Context, cfg *rest.Config, name string) *v1alpha1.NativeCCM {
	tb.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	u, err := dyn.Resource(v1alpha1.GroupVersion.WithResource("nativeccms")).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		tb.Fatalf("NativeCCM %s: %v", name, err)
	}
	o := &v1alpha1.NativeCCM{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, o); err != nil {
		tb.Fatalf("NativeCCM %s: %v", name, err)
	}
	return o
}

// WaitNativeCCMRunning waits until the NativeCCM is Ready, Gated and Healthy
// with a leader pod (the patch helper writes conditions before the rest of the
// status), or fails the test with its last status.
func WaitNativeCCMRunning(tb testing.TB, ctx context.Context, cfg *rest.Config, name string) *v1alpha1.NativeCCM {
	tb.Helper()
	var last *v1alpha1.NativeCCM
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 4*time.Minute, true, func(context.Context) (bool, error) {
		last = NativeCCM(tb, ctx, cfg, name)
		return apimeta.IsStatusConditionTrue(last.Status.Conditions, "Ready") &&
			apimeta.IsStatusConditionTrue(last.Status.Conditions, v1alpha1.GatedCondition) &&
			apimeta.IsStatusConditionTrue(last.Status.Conditions, v1alpha1.HealthyCondition) && last.Status.Leader != nil && last.Status.Leader.Pod != "", nil
	}); err != nil {
		tb.Fatalf("NativeCCM %s not Ready, Gated and Healthy with a leader: %+v", name, last.Status)
	}
	return last
}
