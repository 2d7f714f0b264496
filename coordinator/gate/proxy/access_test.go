package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

func TestParseAccess(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want proxy.Access
		bad  bool
	}{
		{in: "verb=get,resource=configmaps,namespace=kube-system,name=extension-apiserver-authentication",
			want: proxy.Access{Verb: "get", Resource: "configmaps", Namespace: "kube-system", Name: "extension-apiserver-authentication"}},
		{in: "verb=patch,group=,resource=services,subresource=status", want: proxy.Access{Verb: "patch", Resource: "services", Subresource: "status"}},
		{in: "verb=get", bad: true},
		{in: "resource=nodes", bad: true},
		{in: "verb=get,resource=nodes,verb=list", bad: true},
		{in: "verb=get,resource=nodes,color=red", bad: true},
		{in: "verb=get,resource=nodes,name", bad: true},
		{in: "verb=get,resource=nodes,name=a b", bad: true},
		{in: "", bad: true},
	} {
		got, err := proxy.ParseAccess(tc.in)
		switch {
		case tc.bad && err == nil:
			t.Errorf("%q: parsed as %+v, want an error", tc.in, got)
		case !tc.bad && (err != nil || got != tc.want):
			t.Errorf("%q: %+v, %v; want %+v", tc.in, got, err, tc.want)
		case !tc.bad:
			if again, err := proxy.ParseAccess(got.String()); err != nil || again != got {
				t.Errorf("%q: String %q reads back as %+v, %v", tc.in, got.String(), again, err)
			}
		}
	}
}

// logLines collects what a logger writes.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, prefix+" "+args)
}

func (l *logLines) last(substr string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.lines) - 1; i >= 0; i-- {
		if strings.Contains(l.lines[i], substr) {
			return l.lines[i]
		}
	}
	return ""
}

// TestStartupAccessWaitsForBindings: on a real API server, a gate with the
// startup access a release derives (release.Lifecycle.StartupAccess) is not
// ready while one binding of the release is missing, and says which access
// it waits for; the RoleBinding to extension-apiserver-authentication-reader
// created later (the one whose lag crashed the hcloud CCM at its first start,
// issue 22 item 8) makes it ready.
func TestStartupAccessWaitsForBindings(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	const ns, name = "kube-system", "native-ccm-late"
	l := release.Lifecycle{Release: name, Namespace: ns, Platform: "late", LeaseName: name, SecurePort: 10290}
	var access []proxy.Access
	for _, a := range l.StartupAccess() {
		access = append(access, proxy.Access{Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource, Namespace: a.Namespace, Name: a.Name})
	}
	user, err := gatetest.ServiceAccountUser(env, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}
	// everything of the release but the authentication reader's binding
	rbac := env.Client.RbacV1()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: release.LifecycleRules()}, metav1.CreateOptions{}))
	must(rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}, Subjects: subjects}, metav1.CreateOptions{}))
	must(rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name + release.AuthDelegatorSuffix},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: release.AuthDelegatorClusterRole}, Subjects: subjects}, metav1.CreateOptions{}))
	must(rbac.Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{name}, Verbs: []string{"get", "update"}},
	}}, metav1.CreateOptions{}))
	must(rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subjects}, metav1.CreateOptions{}))

	logs := &logLines{}
	g := startGate(t, "late", func(c *proxy.Config) {
		c.Upstream, c.DisableCache, c.StartupAccess = user, true, access
		c.Log = funcr.New(logs.add, funcr.Options{})
	})
	// It has asked and found exactly the reader's access missing.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return logs.last("waiting for the CCM's permissions") != "", nil
	})
	if err != nil {
		t.Fatalf("the gate never said what it waits for: %v", err)
	}
	waiting := logs.last("waiting for the CCM's permissions")
	for _, verb := range []string{"get", "list", "watch"} {
		if want := verb + " configmaps kube-system/extension-apiserver-authentication"; !strings.Contains(waiting, want) {
			t.Errorf("the gate waits for %q, want %q in it", waiting, want)
		}
	}
	if strings.Contains(waiting, "nodes") || strings.Contains(waiting, "leases") || strings.Contains(waiting, "tokenreviews") {
		t.Errorf("the gate waits for granted access: %s", waiting)
	}
	if g.proxy.Ready() {
		t.Fatal("ready while the CCM may not read the client CA")
	}

	must(rbac.RoleBindings(release.AuthenticationReaderNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + release.AuthenticationReaderSuffix, Namespace: release.AuthenticationReaderNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: release.AuthenticationReaderRole}, Subjects: subjects}, metav1.CreateOptions{}))
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return g.proxy.Ready(), nil
	})
	if err != nil {
		t.Fatalf("not ready after the last binding: %v; last log: %s", err, logs.last(""))
	}
	if line := logs.last("may do what it needs at start"); !strings.Contains(line, fmt.Sprintf(`"checked"=%d`, len(access))) {
		t.Errorf("log %q, want it to say it checked %d", line, len(access))
	}
}
