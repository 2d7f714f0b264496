package integration

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{}, func(e *testenv.Env) { env = e }))
}

const (
	// approverUser is the identity the controller runs as in these tests, with exactly
	// the RBAC documented in ccm/csr/doc.go.
	approverUser = "talos-ccm"
	// testLabel marks every object a test creates, for cleanup.
	testLabel = "hybrid-ccm.test/case"
)

var (
	setupOnce sync.Once
	setupErr  error
	approver  kubernetes.Interface
	usersMu   sync.Mutex
	users     = map[string]kubernetes.Interface{}
)

// setup installs the RBAC once: nodes (group system:nodes, and one named node user
// without that group) may create and read CSRs, like kubelets; the approver gets the
// documented minimal rules.
func setup(t testing.TB) {
	t.Helper()
	setupOnce.Do(func() { setupErr = installRBAC(context.Background()) })
	if setupErr != nil {
		t.Fatalf("setup: %v", setupErr)
	}
}

func installRBAC(ctx context.Context) error {
	rbac := env.Client.RbacV1()
	roles := []*rbacv1.ClusterRole{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "test:kubelet-csr-requester"},
			Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
				Verbs: []string{"create", "get", "list", "watch"},
			}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "test:talos-ccm-csr-approver"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests/approval"}, Verbs: []string{"update"}},
				{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, ResourceNames: []string{certificatesv1.KubeletServingSignerName}, Verbs: []string{"approve"}},
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
				{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"servicecidrs"}, Verbs: []string{"list", "watch"}},
			},
		},
	}
	// the API server's own Service and endpoints, by name, in default
	if _, err := rbac.Roles(metav1.NamespaceDefault).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "test:talos-ccm-csr-approver"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services"}, ResourceNames: []string{"kubernetes"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, ResourceNames: []string{"kubernetes"}, Verbs: []string{"list", "watch"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := rbac.RoleBindings(metav1.NamespaceDefault).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test:talos-ccm-csr-approver"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "test:talos-ccm-csr-approver"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: approverUser}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	bindings := []*rbacv1.ClusterRoleBinding{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "test:kubelet-csr-requester"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "test:kubelet-csr-requester"},
			Subjects: []rbacv1.Subject{
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"},
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "system:node:lone-1"},
			},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "test:talos-ccm-csr-approver"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "test:talos-ccm-csr-approver"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: approverUser}},
		},
	}
	for _, r := range roles {
		if _, err := rbac.ClusterRoles().Create(ctx, r, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for _, b := range bindings {
		if _, err := rbac.ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	cs, err := userClient(approverUser)
	if err != nil {
		return err
	}
	approver = cs
	// RBAC is cached by the authorizer; wait until the approver can list CSRs.
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := approver.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
}

// userClient returns a clientset authenticated (client certificate) as name/groups.
func userClient(name string, groups ...string) (kubernetes.Interface, error) {
	key := name + "|" + strings.Join(groups, ",")
	usersMu.Lock()
	defer usersMu.Unlock()
	if cs, ok := users[key]; ok {
		return cs, nil
	}
	cfg, err := env.AddUser(name, groups...)
	if err != nil {
		return nil, fmt.Errorf("add user %s: %w", name, err)
	}
	cfg.QPS, cfg.Burst = -1, -1
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	users[key] = cs
	return cs, nil
}

// nodeClient is the kubelet identity of node name (group system:nodes).
func nodeClient(t testing.TB, name string) kubernetes.Interface {
	t.Helper()
	cs, err := userClient("system:node:"+name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// impersonating returns a client acting as node name through impersonation (cheap,
// for the benchmark's thousand nodes); the API server still sets spec.username.
func impersonating(t testing.TB, name string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + name, Groups: []string{"system:nodes", "system:authenticated"}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

var labelUnsafe = regexp.MustCompile(`[^A-Za-z0-9]+`)

// caseLabel is a label value unique to the running test.
func caseLabel(t testing.TB) string {
	v := strings.Trim(labelUnsafe.ReplaceAllString(t.Name(), "-"), "-")
	if len(v) > 63 {
		v = strings.Trim(v[len(v)-63:], "-")
	}
	return v
}

// nodeSpec is a Node as the tests need it.
type nodeSpec struct {
	name string
	// initialized: talos-ccm has set providerID and removed the uninitialized taint.
	initialized bool
	// kubeletIPs go into the provided-node-ip annotation and status.addresses, as a
	// kubelet writes them (the tests make them differ from what Talos reported).
	kubeletIPs []string
	// kubeletHostname goes into status.addresses as Hostname.
	kubeletHostname string
}

// createNode creates the Node and its status; it is deleted when the test ends.
func createNode(t testing.TB, s nodeSpec) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        s.name,
		Labels:      map[string]string{testLabel: caseLabel(t)},
		Annotations: map[string]string{"alpha.kubernetes.io/provided-node-ip": strings.Join(s.kubeletIPs, ",")},
	}}
	if s.initialized {
		n.Spec.ProviderID = "talos://metal/" + s.name
		n.Labels[names.PlatformLabel] = "metal"
	} else {
		n.Spec.Taints = []corev1.Taint{{Key: names.UninitializedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	}
	created, err := env.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", s.name, err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), s.name, metav1.DeleteOptions{}) })
	for _, ip := range s.kubeletIPs {
		created.Status.Addresses = append(created.Status.Addresses, csrtest.InternalIP(ip))
	}
	if s.kubeletHostname != "" {
		created.Status.Addresses = append(created.Status.Addresses, csrtest.Hostname(s.kubeletHostname))
	}
	created, err = env.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update node status %s: %v", s.name, err)
	}
	return created
}

// submit creates a kubelet-serving CSR as the given identity, like a kubelet.
func submit(t testing.TB, as kubernetes.Interface, name string, request []byte, edit func(*certificatesv1.CertificateSigningRequest)) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	obj := csrtest.Object(name, request)
	obj.Labels = map[string]string{testLabel: caseLabel(t)}
	if edit != nil {
		edit(obj)
	}
	created, err := as.CertificatesV1().CertificateSigningRequests().Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create CSR %s: %v", name, err)
	}
	return created
}

// cleanupCSRs deletes the test's CSRs when it ends, so that later tests' controllers
// never see them.
func cleanupCSRs(t testing.TB) {
	sel := testLabel + "=" + caseLabel(t)
	t.Cleanup(func() {
		_ = env.Client.CertificatesV1().CertificateSigningRequests().DeleteCollection(context.Background(),
			metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel})
	})
}

// startController runs node-csr-approval as the approver identity until stop is
// called or the test ends.
func startController(t testing.TB, client kubernetes.Interface, opts *csr.Options, nodeFacts csr.NodeFacts) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := csr.NewController(client, factory.Certificates().V1().CertificateSigningRequests(), factory.Core().V1().Nodes(), nodeFacts, nil, opts)
	if err != nil {
		t.Fatalf("NewController: %v", err)
	}
	factory.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			factory.Shutdown()
		})
	}
	t.Cleanup(stop)
	return stop
}

func decided(c *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequestCondition {
	for i, cond := range c.Status.Conditions {
		if cond.Type == certificatesv1.CertificateApproved || cond.Type == certificatesv1.CertificateDenied {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}

// waitDecided polls until the CSR has an Approved or Denied condition.
func waitDecided(t testing.TB, name string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	var got *certificatesv1.CertificateSigningRequest
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := env.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = c
		return decided(c) != nil, nil
	})
	if err != nil {
		t.Fatalf("CSR %s not decided: %v (conditions %+v)", name, err, got.Status.Conditions)
	}
	return got
}

// wantCondition checks that the CSR carries exactly one condition, of the given type
// and reason, with Status True.
func wantCondition(t testing.TB, c *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType, reason string) {
	t.Helper()
	if len(c.Status.Conditions) != 1 {
		t.Fatalf("CSR %s has conditions %+v, want exactly one %s/%s", c.Name, c.Status.Conditions, typ, reason)
	}
	got := c.Status.Conditions[0]
	if got.Type != typ || got.Reason != reason || got.Status != corev1.ConditionTrue || got.Message == "" {
		t.Fatalf("CSR %s condition %s/%s/%s %q, want %s/True/%s", c.Name, got.Type, got.Status, got.Reason, got.Message, typ, reason)
	}
}

// waitEvent polls until an event with reason exists for the object (by UID, so that
// events of an earlier object with the same name do not count).
func waitEvent(t testing.TB, kind string, obj metav1.Object, reason string) corev1.Event {
	t.Helper()
	name := obj.GetName()
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "involvedObject.uid": string(obj.GetUID()), "reason": reason}.AsSelector().String()
	var found corev1.Event
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := env.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil || len(evs.Items) == 0 {
			return false, err
		}
		found = evs.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("no %s event for %s %s: %v", reason, kind, name, err)
	}
	return found
}

// decisions reads talos_ccm_csr_decisions_total{decision,reason} from the registry
// the controller registers with.
func decisions(t testing.TB, decision, reason string) float64 {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "talos_ccm_csr_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["decision"] == decision && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// waitCounter polls until the counter reached at least want.
func waitCounter(t testing.TB, decision, reason string, want float64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return decisions(t, decision, reason) >= want, nil
	})
	if err != nil {
		t.Fatalf("talos_ccm_csr_decisions_total{decision=%q,reason=%q} = %v, want >= %v", decision, reason, decisions(t, decision, reason), want)
	}
}

func isInvalid(err error) bool { return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) }

// parseFlags sets opts from command-line style flags, as talos-ccm does.
func parseFlags(opts *csr.Options, args ...string) error {
	fs := pflag.NewFlagSet("talos-ccm", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return opts.Validate()
}
