package gitops_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/fluxcd/cli-utils/pkg/kstatus/status"
	"github.com/fluxcd/pkg/apis/meta"
	fluxcel "github.com/fluxcd/pkg/runtime/cel"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// releaseValues composes the values helm-controller passes to the chart: the
// valuesFrom entries in order (maps merged, later keys winning, lists
// replaced), then spec.values.
func releaseValues(t *testing.T, e environment) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, ref := range e.release.Spec.ValuesFrom {
		data, _, _ := unstructured.NestedStringMap(e.configMaps[ref.Name].Object, "data")
		v := map[string]any{}
		if err := yaml.Unmarshal([]byte(data[ref.ValuesKey]), &v); err != nil {
			t.Fatalf("%s: ConfigMap %s key %s: %v", e.name, ref.Name, ref.ValuesKey, err)
		}
		mergeValues(out, v)
	}
	if e.release.Spec.Values != nil {
		v := map[string]any{}
		if err := json.Unmarshal(e.release.Spec.Values.Raw, &v); err != nil {
			t.Fatal(err)
		}
		mergeValues(out, v)
	}
	return out
}

func mergeValues(dst, src map[string]any) {
	for k, sv := range src {
		if sm, ok := sv.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeValues(dm, sm)
				continue
			}
		}
		dst[k] = sv
	}
}

// renderRelease renders the umbrella the way helm-controller would install it
// for the environment (schema validation included).
func renderRelease(t *testing.T, e environment) []*unstructured.Unstructured {
	t.Helper()
	return renderWith(t, e, releaseValues(t, e))
}

// renderWith renders the umbrella as renderRelease does, with these values.
func renderWith(t *testing.T, e environment, vals map[string]any) []*unstructured.Unstructured {
	t.Helper()
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.ReleaseName, in.Namespace = e.release.Spec.ReleaseName, e.release.Spec.TargetNamespace
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.KubeVersion = &chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}
	rel, err := in.Run(chartstest.Umbrella(t), vals)
	if err != nil {
		t.Fatalf("%s: the chart refuses the environment's values: %v", e.name, err)
	}
	out, err := chartstest.Parse(rel.Manifest)
	if err != nil {
		t.Fatalf("%s: the rendered chart does not parse: %v", e.name, err)
	}
	return out
}

// TestEnvironmentValuesRenderChart: each environment's values (environment
// file + cloud files, merged as helm-controller merges them) pass the chart's
// schemas and yield the NativeCCMs the Flux Kustomization health-checks; every
// NativeCCM finds its credentials Secret, with the keys its profile requires,
// among the environment's encrypted Secrets in the coordinator's namespace.
func TestEnvironmentValuesRenderChart(t *testing.T) {
	profiles, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range environments(t) {
		t.Run(env, func(t *testing.T) {
			e := loadEnvironment(t, env)
			var rendered []string
			objs := renderRelease(t, e)
			// the coordinator reads credentials in its own namespace
			ns := ""
			for _, o := range objs {
				if o.GetKind() == "Deployment" && o.GetLabels()["app.kubernetes.io/name"] == "ccm-coordinator" {
					ns = o.GetNamespace()
				}
			}
			if ns == "" {
				t.Fatal("no ccm-coordinator Deployment rendered")
			}
			if !slices.ContainsFunc(e.namespaces, func(n *unstructured.Unstructured) bool { return n.GetName() == ns }) {
				t.Errorf("namespace %s of the coordinator and the credentials is not created by %s (the chart is told not to)", ns, e.secretsPath)
			}
			var defaults []string
			defer func() {
				// a second default would only get a Conflict
				if len(defaults) > 1 {
					t.Errorf("NativeCCMs %v are all the default for Services without a class; at most one can be", defaults)
				}
			}()
			for _, o := range objs {
				if o.GetKind() != v1.NativeCCMKind {
					continue
				}
				var n v1.NativeCCM
				if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &n, true); err != nil {
					t.Fatalf("NativeCCM %s: %v", o.GetName(), err)
				}
				rendered = append(rendered, n.Name)

				p, ok := profiles.Get(n.ProfileName())
				if !ok {
					t.Errorf("NativeCCM %s: no built-in profile %s", n.Name, n.ProfileName())
					continue
				}
				if n.LoadBalancersEnabled() {
					if ok, why := p.Supports(); !ok {
						t.Errorf("NativeCCM %s enables load balancers: %s", n.Name, why)
					}
				}
				if n.Spec.LoadBalancers != nil && n.Spec.LoadBalancers.Default {
					defaults = append(defaults, n.Name)
				}
				secretName := p.Credentials.SecretName
				if n.Spec.Credentials != nil {
					secretName = n.Spec.Credentials.SecretRef.Name
				}
				if !p.NeedsSecret() {
					continue
				}
				i := slices.IndexFunc(e.secrets, func(s *unstructured.Unstructured) bool {
					return s.GetName() == secretName && s.GetNamespace() == ns
				})
				if i < 0 {
					t.Errorf("NativeCCM %s needs Secret %s/%s; %s does not ship it", n.Name, ns, secretName, e.secretsPath)
					continue
				}
				have, _, _ := unstructured.NestedMap(e.secrets[i].Object, "stringData")
				data, _, _ := unstructured.NestedMap(e.secrets[i].Object, "data")
				for _, k := range p.SecretKeys() {
					if _, ok := have[k]; !ok {
						if _, ok := data[k]; !ok {
							t.Errorf("Secret %s lacks key %q that profile %s requires", secretName, k, p.Name)
						}
					}
				}
			}

			var checked []string
			for _, hc := range e.syncs["hybrid-ccm"].Spec.HealthChecks {
				if hc.Kind == v1.NativeCCMKind {
					checked = append(checked, hc.Name)
				}
			}
			slices.Sort(rendered)
			slices.Sort(checked)
			if len(rendered) == 0 || !slices.Equal(rendered, checked) {
				t.Errorf("NativeCCMs rendered %v, health-checked %v: every enabled cloud should gate the Kustomization's readiness", rendered, checked)
			}
		})
	}
}

// nativeCCM is a NativeCCM in a given state, as the API server returns it.
func nativeCCM(t *testing.T, generation, observed int64, conds ...metav1.Condition) *unstructured.Unstructured {
	t.Helper()
	n := &v1.NativeCCM{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1.GroupVersion.String(), Kind: v1.NativeCCMKind},
		ObjectMeta: metav1.ObjectMeta{Name: "hcloud", Generation: generation},
		Spec:       v1.NativeCCMSpec{Platform: "hcloud"},
		Status:     v1.NativeCCMStatus{ObservedGeneration: observed, Conditions: conds},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(n)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

func cond(typ string, s metav1.ConditionStatus, reason string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: "m", LastTransitionTime: metav1.Now()}
}

// TestNativeCCMHealthCheckExprs: the healthCheckExprs of every environment,
// evaluated by Flux's own status evaluator (what kustomize-controller runs),
// judge NativeCCM states the way docs/gitops.md says.
func TestNativeCCMHealthCheckExprs(t *testing.T) {
	const (
		T = metav1.ConditionTrue
		F = metav1.ConditionFalse
		U = metav1.ConditionUnknown
	)
	cases := []struct {
		name string
		obj  *unstructured.Unstructured
		want status.Status
	}{
		{"installed and up to date", nativeCCM(t, 2, 2, cond(meta.ReadyCondition, T, v1.UpToDateReason)), status.CurrentStatus},
		{"no node of the platform yet", nativeCCM(t, 1, 1, cond(meta.ReadyCondition, T, v1.NoNodesReason)), status.CurrentStatus},
		{"spec changed, not yet reconciled", nativeCCM(t, 3, 2, cond(meta.ReadyCondition, T, v1.UpToDateReason)), status.InProgressStatus},
		{"reconciling", nativeCCM(t, 1, 0, cond(meta.ReconcilingCondition, T, "Progressing"), cond(meta.ReadyCondition, U, "Progressing")), status.InProgressStatus},
		{"waiting for its credentials", nativeCCM(t, 1, 1, cond(meta.ReadyCondition, F, v1.CredentialsNotFoundReason)), status.InProgressStatus},
		{"bad profile (stalled)", nativeCCM(t, 1, 1, cond(meta.StalledCondition, T, v1.ProfileNotFoundReason), cond(meta.ReadyCondition, F, v1.ProfileNotFoundReason)), status.FailedStatus},
		{"Helm upgrade failed", nativeCCM(t, 1, 1, cond(meta.ReadyCondition, F, v1.UpgradeFailedReason)), status.FailedStatus},
		{"Helm install failed", nativeCCM(t, 1, 1, cond(meta.ReadyCondition, F, v1.InstallFailedReason)), status.FailedStatus},
		{"no conditions yet", nativeCCM(t, 1, 0), status.InProgressStatus},
		// the installed CCM itself (docs/coordinator.md, "What Ready means"): Helm's answer is not enough
		{"installed, its CCM leads and renews its lease", nativeCCM(t, 1, 1, cond(meta.ReadyCondition, T, v1.InstallSucceededReason), cond(v1.HealthyCondition, T, v1.LeaseRenewedReason)), status.CurrentStatus},
		{"installed, its CCM crash-loops", nativeCCM(t, 1, 1, cond(meta.ReadyCondition, F, v1.CrashLoopingReason), cond(v1.HealthyCondition, F, v1.CrashLoopingReason), cond(v1.InstalledCondition, T, v1.InstallSucceededReason)), status.FailedStatus},
		{"installed, its lease is not renewed", nativeCCM(t, 1, 1, cond(meta.ReadyCondition, F, v1.LeaseNotRenewedReason), cond(v1.HealthyCondition, F, v1.LeaseNotRenewedReason)), status.FailedStatus},
		{"installed, its lease is held by someone else", nativeCCM(t, 1, 1, cond(meta.ReadyCondition, F, v1.LeaseHeldByForeignIdentityReason), cond(v1.HealthyCondition, F, v1.LeaseHeldByForeignIdentityReason)), status.FailedStatus},
		{"installed, its CCM is starting", nativeCCM(t, 1, 0, cond(meta.ReconcilingCondition, T, meta.ProgressingWithRetryReason), cond(meta.ReadyCondition, F, v1.NoRunningPodsReason), cond(v1.HealthyCondition, F, v1.NoRunningPodsReason)), status.InProgressStatus},
		{"installed, a new pod is taking over the lease", nativeCCM(t, 1, 0, cond(meta.ReconcilingCondition, T, meta.ProgressingWithRetryReason), cond(meta.ReadyCondition, F, v1.LeaderGoneReason)), status.InProgressStatus},
	}
	for _, env := range environments(t) {
		e := loadEnvironment(t, env)
		var exprs []string
		for _, hc := range e.syncs["hybrid-ccm"].Spec.HealthCheckExprs {
			if hc.APIVersion != v1.GroupVersion.String() || hc.Kind != v1.NativeCCMKind {
				continue
			}
			exprs = append(exprs, fmt.Sprint(hc.HealthCheckExpressions))
			ev, err := fluxcel.NewStatusEvaluator(&hc.HealthCheckExpressions)
			if err != nil {
				t.Fatalf("%s: %v", env, err)
			}
			for _, tc := range cases {
				res, err := ev.Evaluate(context.Background(), tc.obj)
				if err != nil {
					t.Errorf("%s/%s: %v", env, tc.name, err)
					continue
				}
				if res.Status != tc.want {
					t.Errorf("%s/%s: %s, want %s", env, tc.name, res.Status, tc.want)
				}
			}
		}
		// Before the coordinator's first status write the object has no status:
		// the expressions cannot be evaluated, which kstatus reports as Unknown
		// (kustomize-controller keeps polling until its timeout), never Current.
		if len(e.syncs["hybrid-ccm"].Spec.HealthCheckExprs) > 0 {
			hc := e.syncs["hybrid-ccm"].Spec.HealthCheckExprs[0]
			ev, err := fluxcel.NewStatusEvaluator(&hc.HealthCheckExpressions)
			if err != nil {
				t.Fatal(err)
			}
			fresh := nativeCCM(t, 1, 0)
			unstructured.RemoveNestedField(fresh.Object, "status")
			if res, err := ev.Evaluate(context.Background(), fresh); err == nil {
				t.Errorf("%s: a NativeCCM without status evaluates to %s; docs/gitops.md says it cannot be evaluated yet", env, res.Status)
			}
		}
		if len(exprs) != 1 {
			t.Errorf("%s: %d NativeCCM healthCheckExprs, want 1", env, len(exprs))
		}
	}
}
