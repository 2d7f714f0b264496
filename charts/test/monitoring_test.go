package charts_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestPrometheusRules: each controller chart's PrometheusRule is opt-in,
// refused with a reason where the Prometheus Operator's CRD is absent, and
// holds exactly the chart's files/prometheus-rules.yaml (the alerts
// test/monitoring evaluates), with the object labels asked for and
// talos-ccm's nodeUninitializedFor in its alert's for:.
func TestPrometheusRules(t *testing.T) {
	for _, c := range []chart{talosCCM, ccmCoordinator} {
		t.Run(string(c), func(t *testing.T) {
			if rs := mustRender(t, c, values(t, `{}`)).find("PrometheusRule"); len(rs) != 0 {
				t.Error("a PrometheusRule by default")
			}
			on := `metrics: {prometheusRule: {enabled: true, labels: {release: prom}}}`
			if c == talosCCM {
				on = `metrics: {prometheusRule: {enabled: true, labels: {release: prom}, nodeUninitializedFor: 42m}}`
			}
			if _, err := render(t, c, values(t, on)); err == nil || !strings.Contains(err.Error(), "the cluster has no monitoring.coreos.com/v1 PrometheusRule") {
				t.Errorf("PrometheusRule without its CRD: %v, want a refusal naming the CRD", err)
			}
			out, err := render(t, c, values(t, on), "monitoring.coreos.com/v1/PrometheusRule")
			if err != nil {
				t.Fatal(err)
			}
			m, err := parse(out)
			if err != nil {
				t.Fatal(err)
			}
			rs := m.find("PrometheusRule")
			if len(rs) != 1 || rs[0].GetLabels()["release"] != "prom" {
				t.Fatalf("PrometheusRules %v", rs)
			}
			b, err := os.ReadFile(filepath.Join("..", string(c), "files", "prometheus-rules.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var want map[string]any
			if err := yaml.Unmarshal(b, &want); err != nil {
				t.Fatal(err)
			}
			if c == talosCCM {
				found := false
				for _, r := range want["groups"].([]any)[0].(map[string]any)["rules"].([]any) {
					if r := r.(map[string]any); r["alert"] == "TalosCCMNodeUninitialized" {
						r["for"], found = "42m", true
					}
				}
				if !found {
					t.Fatal("no TalosCCMNodeUninitialized alert")
				}
			}
			if got := rs[0].Object["spec"]; !reflect.DeepEqual(got, want) {
				t.Errorf("PrometheusRule spec is not files/prometheus-rules.yaml:\n%v\nwant\n%v", got, want)
			}
		})
	}
}

// TestGrafanaDashboard: the umbrella's dashboard ConfigMap is opt-in, carries
// the sidecar's label, and holds files/hybrid-ccm-dashboard.json as it is.
func TestGrafanaDashboard(t *testing.T) {
	for _, cm := range mustRender(t, hybridCCM, values(t, `{}`)).find("ConfigMap") {
		if strings.HasSuffix(cm.GetName(), "-dashboard") {
			t.Errorf("dashboard ConfigMap %s by default", cm.GetName())
		}
	}
	m := mustRender(t, hybridCCM, values(t, `grafanaDashboard: {enabled: true, annotations: {grafana_folder: Kubernetes}}`))
	var data map[string]any
	for _, cm := range m.find("ConfigMap") {
		if strings.HasSuffix(cm.GetName(), "-dashboard") {
			if cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetAnnotations()["grafana_folder"] != "Kubernetes" {
				t.Errorf("dashboard ConfigMap labels %v annotations %v", cm.GetLabels(), cm.GetAnnotations())
			}
			data, _ = cm.Object["data"].(map[string]any)
		}
	}
	b, err := os.ReadFile(filepath.Join("..", "hybrid-ccm", "files", "hybrid-ccm-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := data["hybrid-ccm-dashboard.json"].(string)
	if strings.TrimSpace(got) != strings.TrimSpace(string(b)) || !json.Valid([]byte(got)) {
		t.Errorf("dashboard ConfigMap data is not files/hybrid-ccm-dashboard.json (%d bytes, want %d)", len(got), len(b))
	}
}
