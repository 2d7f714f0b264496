package proxy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// TestClientTokenNeedsOwnCredentials: a client token is the only credential
// the proxy accepts, so it cannot forward the client's credentials.
func TestClientTokenNeedsOwnCredentials(t *testing.T) {
	up := &rest.Config{Host: "https://127.0.0.1:1"}
	tok := []byte(strings.Repeat("a", 43))
	for _, tc := range []struct {
		name string
		cfg  proxy.Config
		ok   bool
	}{
		{"forward", proxy.Config{Upstream: up, Platform: "x", Credentials: proxy.ForwardCredentials, ClientToken: tok, DisableCache: true}, false},
		{"default mode", proxy.Config{Upstream: up, Platform: "x", ClientToken: tok, DisableCache: true}, false},
		{"short token", proxy.Config{Upstream: up, Platform: "x", Credentials: proxy.OwnCredentials, ClientToken: []byte("short"), DisableCache: true}, false},
		{"own", proxy.Config{Upstream: up, Platform: "x", Credentials: proxy.OwnCredentials, ClientToken: tok, DisableCache: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := proxy.New(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestLoadOrCreateClientToken: random per file, reused by a restarted gate,
// replaced when the file holds something that is not a token of ours.
func TestLoadOrCreateClientToken(t *testing.T) {
	dir := t.TempDir()
	a, err := proxy.LoadOrCreateClientToken(filepath.Join(dir, "a", "token"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := proxy.LoadOrCreateClientToken(filepath.Join(dir, "b", "token"))
	if err != nil {
		t.Fatal(err)
	}
	if len(a) < 32 || string(a) == string(b) {
		t.Fatalf("tokens %q and %q: want two different random tokens", a, b)
	}
	again, err := proxy.LoadOrCreateClientToken(filepath.Join(dir, "a", "token"))
	if err != nil || string(again) != string(a) {
		t.Fatalf("second load %q (%v), want the first token %q", again, err, a)
	}
	st, err := os.Stat(filepath.Join(dir, "a", "token"))
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("token file %v (%v), want mode 0644", st, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a", "token"), []byte("short\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	replaced, err := proxy.LoadOrCreateClientToken(filepath.Join(dir, "a", "token"))
	if err != nil || len(replaced) < 32 || string(replaced) == string(a) {
		t.Fatalf("token after a bad file %q (%v): want a new one", replaced, err)
	}
}

// TestGateBinaryClientToken runs the real ccm-gate as the sidecar runs it:
// its own ServiceAccount credentials upstream (--credentials=own), and a
// client token it creates in the directory it shares with the CCM
// (--client-token-file). The CCM's kubeconfig names only that file. With it
// the CCM sees its view as its ServiceAccount (the user the fence keys on),
// including what its secure port's delegated authentication needs; without it,
// or with anything else (even the ServiceAccount's real token), the gate
// answers 401; and the client token is worth nothing at the API server.
func TestGateBinaryClientToken(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const sa, platform = "native-ccm-viewtoken", "token-own"
	// Exactly the release's identity: lifecycle RBAC and the two
	// delegated-authentication bindings (release.Lifecycle's).
	if err := gatetest.GrantLifecycle(ctx, env.Client, ccmNamespace, sa); err != nil {
		t.Fatal(err)
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ccmNamespace}}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa + release.AuthDelegatorSuffix},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: release.AuthDelegatorClusterRole},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().RoleBindings(release.AuthenticationReaderNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa + release.AuthenticationReaderSuffix},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: release.AuthenticationReaderRole},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	fixture(t, "clienttoken",
		gatetest.NodeSpec{Name: "token-own-1", Platform: platform, ProviderID: "hcloud://71", Ready: true},
		gatetest.NodeSpec{Name: "token-foreign-1", Platform: "token-foreign", ProviderID: "aws:///a/i-71", Ready: true},
	)
	saToken, err := gatetest.ServiceAccountToken(ctx, env.Client, ccmNamespace, sa)
	if err != nil {
		t.Fatal(err)
	}
	bin := gateBinary(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "tls", "token") // beside the certificate, as in the pod
	upstream := &rest.Config{Host: env.Config.Host, BearerToken: saToken, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}}
	start := func() *gatetest.Gate {
		g, err := gatetest.StartGate(bin, dir, platform, upstream, "", "--credentials=own", "--client-token-file="+tokenFile)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Stop)
		return g
	}
	g := start()
	clientToken, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatalf("the gate wrote no client token: %v", err)
	}
	if len(clientToken) < 32 || string(clientToken) == saToken {
		t.Fatalf("client token %q", clientToken)
	}

	// What the CCM's kubeconfig says: the gate, its CA, the token file.
	ccmConfig := func(g *gatetest.Gate) *rest.Config {
		return &rest.Config{Host: g.Config.Host, TLSClientConfig: g.Config.TLSClientConfig, BearerTokenFile: tokenFile, QPS: -1, Burst: -1}
	}
	ccm := kubernetes.NewForConfigOrDie(ccmConfig(g))

	t.Run("only the client token passes", func(t *testing.T) {
		ca, err := os.ReadFile(g.Config.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
		for _, tc := range []struct {
			name   string
			header []string
			want   int
		}{
			{"none", nil, http.StatusUnauthorized},
			{"the ServiceAccount's own token", []string{"Bearer " + saToken}, http.StatusUnauthorized},
			{"client token with a suffix", []string{"Bearer " + string(clientToken) + "x"}, http.StatusUnauthorized},
			{"client token prefix", []string{"Bearer " + string(clientToken[:len(clientToken)-1])}, http.StatusUnauthorized},
			{"client token as basic auth", []string{"Basic " + string(clientToken)}, http.StatusUnauthorized},
			{"client token twice", []string{"Bearer " + string(clientToken), "Bearer " + string(clientToken)}, http.StatusUnauthorized},
			{"client token", []string{"Bearer " + string(clientToken)}, http.StatusOK},
			{"client token, lower-case scheme", []string{"bearer " + string(clientToken)}, http.StatusOK},
		} {
			t.Run(tc.name, func(t *testing.T) {
				for _, path := range []string{"/api/v1/nodes", "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication", "/version"} {
					req, err := http.NewRequest(http.MethodGet, g.Config.Host+path, nil)
					if err != nil {
						t.Fatal(err)
					}
					for _, h := range tc.header {
						req.Header.Add("Authorization", h)
					}
					resp, err := hc.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					body, _ := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != tc.want {
						t.Errorf("GET %s: %d %.300s, want %d", path, resp.StatusCode, body, tc.want)
					}
					if tc.want == http.StatusUnauthorized {
						var st metav1.Status
						if err := json.Unmarshal(body, &st); err != nil || st.Reason != metav1.StatusReasonUnauthorized {
							t.Errorf("GET %s: body %.300s, want an Unauthorized Status", path, body)
						}
					}
				}
			})
		}
	})

	t.Run("the API server sees the ServiceAccount, never the client", func(t *testing.T) {
		// Impersonation headers are dropped with the client's credentials.
		cfg := ccmConfig(g)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:admin", Groups: []string{"system:masters"}}
		for _, c := range []*rest.Config{ccmConfig(g), cfg} {
			ssr, err := kubernetes.NewForConfigOrDie(c).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := ssr.Status.UserInfo.Username, gatetest.Username(ccmNamespace, sa); got != want {
				t.Errorf("through the gate the API server sees %q (impersonating %q), want %q", got, c.Impersonate.UserName, want)
			}
		}
		nodes, err := ccm.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "gatetest=clienttoken"})
		if err != nil {
			t.Fatal(err)
		}
		if got := nodeNames(nodes.Items); !slices.Equal(got, []string{"token-own-1"}) {
			t.Errorf("view %v, want only token-own-1", got)
		}
	})

	t.Run("delegated authentication through the gate", func(t *testing.T) {
		// What the CCM's secure port does with --authentication-kubeconfig and
		// --authorization-kubeconfig pointing at the gate.
		if _, err := ccm.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{}); err != nil {
			t.Errorf("client CA configmap: %v", err)
		}
		tr, err := ccm.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: saToken}}, metav1.CreateOptions{})
		if err != nil || !tr.Status.Authenticated || tr.Status.User.Username != gatetest.Username(ccmNamespace, sa) {
			t.Errorf("TokenReview: %+v, %v", tr, err)
		}
		sar, err := ccm.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: gatetest.Username(ccmNamespace, sa), NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
		}}, metav1.CreateOptions{})
		if err != nil || sar.Status.EvaluationError != "" {
			t.Errorf("SubjectAccessReview: %+v, %v", sar, err)
		}
	})

	t.Run("the client token is no credential at the API server", func(t *testing.T) {
		direct := kubernetes.NewForConfigOrDie(&rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}, BearerTokenFile: tokenFile})
		_, err := direct.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if !apierrors.IsUnauthorized(err) {
			t.Errorf("direct list with the client token: %v, want 401 Unauthorized", err)
		}
	})

	t.Run("a restarted gate keeps the pod's token", func(t *testing.T) {
		g.Stop()
		g2 := start()
		again, err := os.ReadFile(tokenFile)
		if err != nil || string(again) != string(clientToken) {
			t.Fatalf("token after restart %q (%v), want %q", again, err, clientToken)
		}
		if _, err := kubernetes.NewForConfigOrDie(ccmConfig(g2)).CoreV1().Nodes().Get(ctx, "token-own-1", metav1.GetOptions{}); err != nil {
			t.Errorf("through the restarted gate: %v", err)
		}
	})
}
