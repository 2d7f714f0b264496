package oncluster

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// scrapeMetrics is what docs/operations.md says a scraper does, on the
// installed release: it finds each controller's metrics endpoints through
// its metrics Service (EndpointSlices, as Prometheus' Kubernetes service
// discovery does) and scrapes them. talos-ccm's /metrics answers a
// ServiceAccount bound to talos-ccm:metrics-reader (the leader with
// talos_ccm_nodes_initialized_total), and
// refuses a request without a token and one of an unbound ServiceAccount
// (403); the coordinator's answers with the Flux runtime's.
func scrapeMetrics(t *testing.T, ctx context.Context) {
	const ns = "monitoring"
	cs := f.Client
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"prometheus", "nobody"} {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "prometheus:talos-ccm-metrics"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "talos-ccm:metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: ns}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	prometheus, nobody := token("prometheus"), token("nobody")

	// talos-ccm serves a self-signed certificate, as the ServiceMonitor says.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(url, bearer string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		return resp.StatusCode, string(b)
	}

	talos := metricsEndpoints(t, ctx, namespace, "talos-ccm-metrics", "https")
	if len(talos) != 2 {
		t.Errorf("talos-ccm-metrics: endpoints %v, want the leader's and the standby's", talos)
	}
	series := 0
	for _, ep := range talos {
		url := "https://" + ep + "/metrics"
		// The leader's and the standby's series differ: the standby has
		// initialized nothing, so it has no talos_ccm_ series yet.
		code, body := get(url, prometheus)
		if code != http.StatusOK || !strings.Contains(body, "# TYPE ") {
			t.Errorf("GET %s as monitoring/prometheus: %d, want 200 with metrics:\n%.300s", url, code, body)
		}
		if strings.Contains(body, "talos_ccm_nodes_initialized_total{") {
			series++
		}
		// Without a token: 401, or 403 for system:anonymous where the
		// delegated authentication lets anonymous requests through.
		if code, body := get(url, ""); code != http.StatusUnauthorized && code != http.StatusForbidden {
			t.Errorf("GET %s without a token: %d, want 401 or 403: %.200s", url, code, body)
		}
		if code, body := get(url, nobody); code != http.StatusForbidden {
			t.Errorf("GET %s as monitoring/nobody (not bound): %d, want 403: %.200s", url, code, body)
		}
	}
	if series == 0 {
		t.Errorf("no talos-ccm endpoint of %v serves talos_ccm_nodes_initialized_total: the leader initialized every node", talos)
	}
	for _, ep := range metricsEndpoints(t, ctx, ccmNamespace, "hybrid-ccm-metrics", "metrics") {
		url := "http://" + ep + "/metrics"
		if code, body := get(url, ""); code != http.StatusOK || !strings.Contains(body, "gotk_reconcile_duration_seconds") {
			t.Errorf("GET %s: %d, want 200 with the Flux runtime's series:\n%.300s", url, code, body)
		}
	}
}

// metricsEndpoints are the ready addresses of a Service's port, from its
// EndpointSlices, once there are any.
func metricsEndpoints(t *testing.T, ctx context.Context, ns, service, port string) []string {
	t.Helper()
	var out []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		slices, err := f.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
		if err != nil {
			return false, nil
		}
		out = nil
		for _, s := range slices.Items {
			var p *int32
			for _, sp := range s.Ports {
				if sp.Name != nil && *sp.Name == port {
					p = sp.Port
				}
			}
			for _, e := range s.Endpoints {
				if p == nil || (e.Conditions.Ready != nil && !*e.Conditions.Ready) {
					continue
				}
				for _, a := range e.Addresses {
					out = append(out, net.JoinHostPort(a, strconv.Itoa(int(*p))))
				}
			}
		}
		return len(out) > 0, nil
	})
	if err != nil {
		t.Fatalf("Service %s/%s: no ready endpoint on port %s", ns, service, port)
	}
	return out
}
