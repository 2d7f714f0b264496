package charts_test

import (
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestStandbysAreSpreadAndBudgeted: with one replica a chart renders no
// PodDisruptionBudget (it would block every drain) and no scheduling
// constraint; with standbys, a budget of one unavailable replica and the
// replicas spread over nodes and zones; the user's own affinity or spread
// replaces the chart's.
func TestStandbysAreSpreadAndBudgeted(t *testing.T) {
	for _, c := range []chart{talosCCM, ccmCoordinator} {
		t.Run(string(c), func(t *testing.T) {
			one := mustRender(t, c, values(t, `replicas: 1`))
			if pdbs := one.find("PodDisruptionBudget"); len(pdbs) != 0 {
				t.Errorf("one replica: %d PodDisruptionBudgets", len(pdbs))
			}
			if d := deploymentOf(t, one); d.Spec.Template.Spec.Affinity != nil || len(d.Spec.Template.Spec.TopologySpreadConstraints) != 0 {
				t.Errorf("one replica: affinity %+v spread %+v", d.Spec.Template.Spec.Affinity, d.Spec.Template.Spec.TopologySpreadConstraints)
			}

			two := mustRender(t, c, values(t, `replicas: 2`))
			d := deploymentOf(t, two)
			pdbs := two.find("PodDisruptionBudget")
			if len(pdbs) != 1 {
				t.Fatalf("two replicas: %d PodDisruptionBudgets", len(pdbs))
			}
			var pdb policyv1.PodDisruptionBudget
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(pdbs[0].Object, &pdb); err != nil {
				t.Fatal(err)
			}
			if pdb.Namespace != d.Namespace || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 ||
				!equalLabels(pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
				t.Errorf("two replicas: budget %s/%s %+v, Deployment %s/%s selects %v", pdb.Namespace, pdb.Name, pdb.Spec, d.Namespace, d.Name, d.Spec.Selector.MatchLabels)
			}
			a := d.Spec.Template.Spec.Affinity
			if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
				a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" ||
				!equalLabels(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector.MatchLabels, d.Spec.Selector.MatchLabels) {
				t.Errorf("two replicas: affinity %+v", a)
			}
			if s := d.Spec.Template.Spec.TopologySpreadConstraints; len(s) != 1 || s[0].TopologyKey != "topology.kubernetes.io/zone" || s[0].WhenUnsatisfiable != "ScheduleAnyway" {
				t.Errorf("two replicas: spread %+v", s)
			}

			own := mustRender(t, c, values(t, `{replicas: 3, podDisruptionBudget: {maxUnavailable: 2}, topologySpreadConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule}]}`))
			d = deploymentOf(t, own)
			if d.Spec.Template.Spec.Affinity != nil || len(d.Spec.Template.Spec.TopologySpreadConstraints) != 1 || d.Spec.Template.Spec.TopologySpreadConstraints[0].WhenUnsatisfiable != "DoNotSchedule" {
				t.Errorf("own spread: affinity %+v spread %+v", d.Spec.Template.Spec.Affinity, d.Spec.Template.Spec.TopologySpreadConstraints)
			}
			if pdbs := own.find("PodDisruptionBudget"); len(pdbs) != 1 || fmt.Sprint(pdbs[0].Object["spec"].(map[string]any)["maxUnavailable"]) != "2" {
				t.Errorf("own budget: %d budgets, %v", len(pdbs), pdbs)
			}
			if pdbs := mustRender(t, c, values(t, `{replicas: 2, podDisruptionBudget: {enabled: false}}`)).find("PodDisruptionBudget"); len(pdbs) != 0 {
				t.Errorf("budget disabled: %d PodDisruptionBudgets", len(pdbs))
			}
		})
	}
}

func deploymentOf(t *testing.T, m manifests) *appsv1.Deployment {
	t.Helper()
	ds := m.find("Deployment")
	if len(ds) != 1 {
		t.Fatalf("%d Deployments", len(ds))
	}
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(ds[0].Object, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

func equalLabels(a, b map[string]string) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
