package gitops_test

import (
	"context"
	"os"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
)

// cp is the package's control plane, with the CRDs the umbrella's objects need
// (the NativeCCM CRD the HelmRelease installs with install.crds: Create, and
// the stand-in for Talos's talos.dev ServiceAccount CRD).
var cp chartstest.ControlPlane

func TestMain(m *testing.M) {
	code := m.Run()
	cp.Stop()
	os.Exit(code)
}

// TestEnvironmentServerSideDryRun: for each environment, the umbrella chart
// rendered with the values its HelmRelease layers (valuesFrom in order, then
// spec.values) is accepted object by object by a real API server
// (server-side apply, dry-run, into the HelmRelease's targetNamespace):
// NativeCCMs pass the CRD's schema and CEL rules and come back defaulted, the
// talos.dev ServiceAccount its CRD, everything else the built-in validation.
func TestEnvironmentServerSideDryRun(t *testing.T) {
	env := cp.Env(t)
	for _, name := range environments(t) {
		t.Run(name, func(t *testing.T) {
			e := loadEnvironment(t, name)
			a := chartstest.NewApplier(t, env, e.release.Spec.TargetNamespace)
			objs := renderRelease(t, e)
			kinds := map[string]int{}
			var nativeCCMs []string
			// the Namespaces for real first (Helm creates them first), so
			// that a dry run of what goes into them can succeed
			for _, obj := range append(slices.Clone(e.namespaces), objs...) {
				if obj.GetKind() == "Namespace" {
					if _, err := a.Apply(context.Background(), obj, false); err != nil {
						t.Fatalf("namespace %s: %v", obj.GetName(), err)
					}
				}
			}
			for _, obj := range objs {
				out, err := a.Apply(context.Background(), obj, true)
				if err != nil {
					t.Errorf("API server rejects: %v", err)
					continue
				}
				kinds[out.GetKind()]++
				if out.GetKind() != v1.NativeCCMKind {
					continue
				}
				nativeCCMs = append(nativeCCMs, out.GetName())
				// the API server's defaulting ran on it
				if install, _, _ := unstructured.NestedString(out.Object, "spec", "install"); install == "" {
					t.Errorf("NativeCCM %s came back without spec.install", out.GetName())
				}
			}
			if len(objs) == 0 || kinds["Deployment"] != 2 {
				t.Errorf("applied %d objects, kinds %v: want both controllers' Deployments", len(objs), kinds)
			}
			// Every NativeCCM the Kustomization health-checks reached the API server.
			for _, hc := range e.syncs["hybrid-ccm"].Spec.HealthChecks {
				if hc.Kind == v1.NativeCCMKind && !slices.Contains(nativeCCMs, hc.Name) {
					t.Errorf("health-checked NativeCCM %s was not applied (applied %v)", hc.Name, nativeCCMs)
				}
			}
			if len(nativeCCMs) == 0 {
				t.Error("no NativeCCM applied: the environment enables no cloud")
			}
		})
	}
}
