package gitops_test

import (
	"maps"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
)

// TestReleaseNeverUninstallsOnFailure: no failure of the HelmRelease removes
// what runs: a failed install is retried (RetryOnFailure), never remediated
// (install remediation is an uninstall, which would delete the talos-ccm the
// release adopted from the bootstrap manifests), and a failed upgrade is
// rolled back, never uninstalled.
func TestReleaseNeverUninstallsOnFailure(t *testing.T) {
	for _, env := range environments(t) {
		t.Run(env, func(t *testing.T) {
			hr := loadEnvironment(t, env).release
			in := hr.Spec.Install
			if in == nil || in.Strategy == nil || in.Strategy.Name != string(helmv2.ActionStrategyRetryOnFailure) {
				t.Errorf("install.strategy %+v, want RetryOnFailure: the default remediates a failed install by uninstalling", in)
			} else if in.GetRetry() == nil || in.GetRetry().GetRetryInterval() <= 0 {
				t.Errorf("install retries at no interval: %+v", in.Strategy)
			}
			if in != nil && in.Remediation != nil && (in.Remediation.MustRemediateLastFailure() || in.Remediation.Retries != 0) {
				t.Errorf("install.remediation %+v uninstalls after a failure", in.Remediation)
			}
			up := hr.Spec.Upgrade
			if up == nil || up.Remediation == nil || up.Remediation.GetStrategy() != helmv2.RollbackRemediationStrategy {
				t.Errorf("upgrade remediation %+v, want rollback", up)
			}
		})
	}
}

// TestNamespacePodSecurity: the coordinator's namespace, which the secrets
// Kustomization creates instead of the chart, carries the Pod Security labels
// the chart would give it with the environment's values (what docs/install.md
// asks for and hybridctl doctor checks: CoordinatorNamespacePodSecurity).
func TestNamespacePodSecurity(t *testing.T) {
	for _, env := range environments(t) {
		t.Run(env, func(t *testing.T) {
			e := loadEnvironment(t, env)
			vals := releaseValues(t, e)
			cc, _ := vals["ccm-coordinator"].(map[string]any)
			if cc == nil {
				cc = map[string]any{}
				vals["ccm-coordinator"] = cc
			}
			cc["createNamespace"] = true
			want := map[string]map[string]string{}
			for _, o := range renderWith(t, e, vals) {
				if o.GetKind() == "Namespace" {
					want[o.GetName()] = podSecurity(o.GetLabels())
				}
			}
			if len(want) == 0 {
				t.Fatal("the chart renders no Namespace even when told to")
			}
			for name, labels := range want {
				found := false
				for _, n := range e.namespaces {
					if n.GetName() != name {
						continue
					}
					found = true
					if got := podSecurity(n.GetLabels()); !maps.Equal(got, labels) {
						t.Errorf("namespace %s in %s: Pod Security labels %v, the chart's %v", name, e.secretsPath, got, labels)
					}
				}
				if !found {
					t.Errorf("namespace %s: not created by %s", name, e.secretsPath)
				}
				if labels["pod-security.kubernetes.io/enforce"] != "restricted" {
					t.Errorf("namespace %s: the chart enforces %q", name, labels["pod-security.kubernetes.io/enforce"])
				}
			}
		})
	}
}

func podSecurity(labels map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		if strings.HasPrefix(k, "pod-security.kubernetes.io/") {
			out[k] = v
		}
	}
	return out
}

// TestRemovalFirstStep: the first commit of docs/gitops.md's removal (every
// cloud enabled: false) renders no NativeCCM and no fence grant while the
// coordinator stays, so that Helm deletes the NativeCCMs with their
// controller still running to finalize them.
func TestRemovalFirstStep(t *testing.T) {
	for _, env := range environments(t) {
		t.Run(env, func(t *testing.T) {
			e := loadEnvironment(t, env)
			vals := releaseValues(t, e)
			clouds, _ := vals["clouds"].(map[string]any)
			if len(clouds) == 0 {
				t.Fatal("the environment enables no cloud")
			}
			for _, c := range clouds {
				c.(map[string]any)["enabled"] = false
			}
			coordinator := false
			for _, o := range renderWith(t, e, vals) {
				switch {
				case o.GetKind() == "NativeCCM":
					t.Errorf("NativeCCM %s still rendered", o.GetName())
				case strings.HasPrefix(o.GetName(), "hybrid-ccm:fence:"):
					t.Errorf("%s %s (a fence grant) still rendered", o.GetKind(), o.GetName())
				case o.GetKind() == "Deployment" && o.GetLabels()["app.kubernetes.io/name"] == "ccm-coordinator":
					coordinator = true
				}
			}
			if !coordinator {
				t.Error("the coordinator is gone in the first step: nobody would finalize the NativeCCMs")
			}
		})
	}
}
