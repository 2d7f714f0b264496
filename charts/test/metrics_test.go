package charts_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestMetricsServices: each controller's metrics are behind a Service that
// selects its pods on the metrics port; talos-ccm's come with the ClusterRole
// a scraper needs (its /metrics is authenticated); the ServiceMonitors are
// opt-in, refused with a reason where the Prometheus Operator's CRD is
// absent, and select the metrics Service where it is present.
func TestMetricsServices(t *testing.T) {
	for _, tc := range []struct {
		c        chart
		port     string
		readRole bool
	}{{talosCCM, "https", true}, {ccmCoordinator, "metrics", false}} {
		t.Run(string(tc.c), func(t *testing.T) {
			m := mustRender(t, tc.c, values(t, `{}`))
			d := deploymentOf(t, m)
			var svc map[string]any
			for _, s := range m.find("Service") {
				if s.GetLabels()["hybridccm.io/metrics"] == "true" {
					svc = s.Object
				}
			}
			if svc == nil {
				t.Fatal("no metrics Service")
			}
			spec := svc["spec"].(map[string]any)
			sel := map[string]string{}
			for k, v := range spec["selector"].(map[string]any) {
				sel[k] = v.(string)
			}
			if !equalLabels(sel, d.Spec.Selector.MatchLabels) || spec["clusterIP"] != "None" {
				t.Errorf("metrics Service selects %v (clusterIP %v), the Deployment's pods are %v", sel, spec["clusterIP"], d.Spec.Selector.MatchLabels)
			}
			port := spec["ports"].([]any)[0].(map[string]any)
			named := false
			for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
				named = named || p.Name == port["targetPort"]
			}
			if port["name"] != tc.port || !named {
				t.Errorf("metrics Service port %v: not a named port of the container", port)
			}
			roles := 0
			for _, r := range m.find("ClusterRole") {
				if strings.HasSuffix(r.GetName(), ":metrics-reader") {
					roles++
					rule := r.Object["rules"].([]any)[0].(map[string]any)
					if len(r.Object["rules"].([]any)) != 1 || rule["nonResourceURLs"].([]any)[0] != "/metrics" || rule["verbs"].([]any)[0] != "get" || len(rule["verbs"].([]any)) != 1 {
						t.Errorf("%s: rules %v, want get on /metrics only", r.GetName(), r.Object["rules"])
					}
				}
			}
			if (roles == 1) != tc.readRole {
				t.Errorf("%d metrics-reader ClusterRoles", roles)
			}
			if len(m.find("ServiceMonitor")) != 0 {
				t.Error("a ServiceMonitor by default")
			}

			on := values(t, `metrics: {serviceMonitor: {enabled: true, labels: {release: prom}}}`)
			if _, err := render(t, tc.c, on); err == nil || !strings.Contains(err.Error(), "the cluster has no monitoring.coreos.com/v1 ServiceMonitor") {
				t.Errorf("ServiceMonitor without its CRD: %v, want a refusal naming the CRD", err)
			}
			rendered, err := render(t, tc.c, on, "monitoring.coreos.com/v1/ServiceMonitor")
			if err != nil {
				t.Fatal(err)
			}
			out, err := parse(rendered)
			if err != nil {
				t.Fatal(err)
			}
			sms := out.find("ServiceMonitor")
			if len(sms) != 1 || sms[0].GetLabels()["release"] != "prom" {
				t.Fatalf("ServiceMonitors %v", sms)
			}
			smSpec := sms[0].Object["spec"].(map[string]any)
			if sel := smSpec["selector"].(map[string]any)["matchLabels"].(map[string]any); sel["hybridccm.io/metrics"] != "true" ||
				smSpec["endpoints"].([]any)[0].(map[string]any)["port"] != tc.port {
				t.Errorf("ServiceMonitor spec %v", smSpec)
			}
		})
	}
}

// TestNetworkPolicies: opt-in; on, each controller's pods may receive only on
// their probe and metrics ports and send only to what they talk to
// (talos-ccm: the Talos API on 50000 and the API server). (The umbrella's
// multi-cloud values turn them on: TestUmbrellaServerSideDryRun has the API
// server validate them.)
func TestNetworkPolicies(t *testing.T) {
	for _, tc := range []struct {
		c      chart
		egress string
	}{{talosCCM, "50000"}, {ccmCoordinator, "443"}} {
		t.Run(string(tc.c), func(t *testing.T) {
			if nps := mustRender(t, tc.c, values(t, `{}`)).find("NetworkPolicy"); len(nps) != 0 {
				t.Errorf("%d NetworkPolicies by default", len(nps))
			}
			m := mustRender(t, tc.c, values(t, `networkPolicy: {enabled: true, apiServer: {cidrs: [10.0.0.10/32], ports: [6443]}}`))
			nps := m.find("NetworkPolicy")
			if len(nps) != 1 {
				t.Fatalf("%d NetworkPolicies", len(nps))
			}
			d := deploymentOf(t, m)
			spec := nps[0].Object["spec"].(map[string]any)
			sel := map[string]string{}
			for k, v := range spec["podSelector"].(map[string]any)["matchLabels"].(map[string]any) {
				sel[k] = v.(string)
			}
			if !equalLabels(sel, d.Spec.Selector.MatchLabels) || nps[0].GetNamespace() != d.Namespace {
				t.Errorf("selects %v in %s, the Deployment's pods are %v in %s", sel, nps[0].GetNamespace(), d.Spec.Selector.MatchLabels, d.Namespace)
			}
			text := fmt.Sprint(spec["egress"])
			if !strings.Contains(text, "10.0.0.10/32") || !strings.Contains(text, "port:6443") || !strings.Contains(text, "port:"+tc.egress) {
				t.Errorf("egress %s", text)
			}
		})
	}
	if _, err := render(t, talosCCM, values(t, `networkPolicy: {enabled: true, talosAPICIDRs: ["10.0.0.0/8; rm"]}`)); err == nil || !strings.Contains(err.Error(), "schema") {
		t.Errorf("a CIDR that is not one: %v", err)
	}
}
