package gate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/gatetest"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// The product's admission policies as docs/deploy installs them: the fence
// and the coordinator's own policy (release ccm-coordinator).
var productPolicies = []string{gate.DefaultFenceName, "ccm-coordinator.hybridccm.io"}

// TestNoStateRefusesOthers drives a real API server through the states the
// product's admission policies must survive, while a kubelet (its own client
// certificate, system:node:<name> in system:nodes), talos-ccm and an admin
// keep writing nodes (create, label, status, delete), Services and
// ConfigMaps: the static manifests (docs/deploy, the NativeCCM CRD among
// them) installed on the running server, two kube-apiserver restarts, the
// CRD deleted and created again, a NativeCCM deleted. No write of theirs may
// be refused by one of the product's policies at any moment (the API server
// being down, or its own authorizer not ready, is no such refusal).
// Meanwhile the native CCM of NativeCCM aws (a ServiceAccount user with
// broad RBAC) never changes a foreign node, and native-ccm-orphan (no
// NativeCCM, broad RBAC) never changes any node or Service; and once things
// settle the aws CCM may again taint its own node.
//
// With the fence of paramKind NativeCCM it replaces, the kubelet's writes were
// refused with "failed to configure policy: failed to find resource
// referenced by paramKind" from the moment the manifests were applied.
func TestNoStateRefusesOthers(t *testing.T) {
	if _, err := testenv.AssetsDir(); err != nil {
		t.Skip(err)
	}
	if testing.Short() {
		t.Skip("restarts an API server: not in -short")
	}
	root := testenv.RepoRoot()
	// A control plane of its own (it restarts it), with only the Talos CRD
	// that Talos itself provides; the product's come with the manifests.
	e, err := testenv.Start(testenv.Options{Restartable: true,
		CRDDirectoryPaths: []string{filepath.Join(root, "charts", "test", "testdata", "crds")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	admin := e.Client
	c, err := gatetest.Client(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns, svcNS = "hybrid-ccm-system", "probe"
	for _, n := range []string{ns, svcNS} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The identities. The kubelet's RBAC is the bootstrap system:node role
	// (the Node authorizer is not on here); talos-ccm's is cluster-admin, so
	// that only admission can stand in the way.
	bind := func(name, role string, subject rbacv1.Subject) {
		t.Helper()
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{subject},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bind("test-kubelets", "system:node", rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"})
	bind("test-talos-ccm", "cluster-admin", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "talos-ccm", Namespace: "kube-system"})
	kubeletCfg, err := e.AddUser("system:node:kubelet-0", "system:nodes", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	as := func(namespace, sa string) *kubernetes.Clientset {
		cfg := rest.CopyConfig(e.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: gatetest.Username(namespace, sa),
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	kubelet := kubernetes.NewForConfigOrDie(kubeletCfg)
	talosCCM := as("kube-system", "talos-ccm")
	for _, sa := range []string{"native-ccm-aws", "native-ccm-orphan"} {
		if err := gatetest.GrantNativeCCM(ctx, admin, ns, sa); err != nil {
			t.Fatal(err)
		}
		if err := grantServices(ctx, admin, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	awsCCM, orphan := as(ns, "native-ccm-aws"), as(ns, "native-ccm-orphan")

	// What the confined identities try: nodes of both platforms, a Service
	// of the aws class.
	if err := gatetest.CreateNodes(ctx, admin,
		gatetest.NodeSpec{Name: "probe-aws", Platform: "aws", ProviderID: "aws:///eu-west-1a/i-0abc"},
		gatetest.NodeSpec{Name: "probe-hcloud", Platform: "hcloud", ProviderID: "hcloud://1001"},
	); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Services(svcNS).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "probe-lb"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To("hybridccm.io/aws"), Ports: []corev1.ServicePort{{Port: 80}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var phase atomic.Value
	phase.Store("before the manifests")
	r := &record{phase: &phase}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	run := func(who string, step func(i int) []attempt) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				for _, a := range step(i) {
					r.add(who, a)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wctx, wcancel := context.WithCancel(ctx)
	// However the test ends: the writers stop, and what they saw is judged.
	defer func() {
		close(stop)
		wcancel()
		wg.Wait()
		r.report(t)
	}()
	// Unconfined writers: every error but a product policy's refusal is fine.
	run("kubelet system:node:kubelet-0", func(i int) []attempt { return nodeWrites(wctx, kubelet, "kubelet-0", i, false) })
	run("admin", func(i int) []attempt {
		return append(nodeWrites(wctx, admin, "admin-0", i, true), otherWrites(wctx, admin, svcNS, i)...)
	})
	run("talos-ccm", func(i int) []attempt { return initializeWrites(wctx, talosCCM, i) })

	soak := func(name string, d time.Duration) {
		phase.Store(name)
		t.Logf("%s: %s", time.Now().Format("15:04:05.000"), name)
		time.Sleep(d)
	}
	const window = 15 * time.Second
	// Some other policy of the cluster's with params (a ConfigMap): the API
	// server's admission RESTMapper then holds the kinds it knew before the
	// CRD came, until its next refresh (every 30 s). A kind it does not know
	// is what made the fence of paramKind NativeCCM refuse everyone.
	warmAdmissionMapper(t, ctx, admin)
	soak("before the manifests", 2*time.Second)

	// Install the product the kubectl way onto the running server.
	phase.Store("static manifests applied")
	applyManifests(t, ctx, e.Config, filepath.Join(root, "docs", "deploy", "talos-ccm.yaml"), filepath.Join(root, "docs", "deploy", "ccm-coordinator.yaml"))
	awsObj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "aws"}, Spec: v1.NativeCCMSpec{Platform: "aws", Install: v1.InstallNever}}
	if err := gate.EnsureGrant(ctx, c, gate.GrantFor(awsObj, ns)); err != nil {
		t.Fatal(err)
	}
	createNativeCCM := func() {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			err := c.Create(ctx, awsObj.DeepCopy())
			return err == nil || apierrors.IsAlreadyExists(err), nil
		}); err != nil {
			t.Fatalf("NativeCCM aws: %v", err)
		}
	}
	createNativeCCM()
	soak("static manifests applied", window)
	waitOwnTaint(t, ctx, awsCCM, "after the manifests")
	// Confined from here on, whatever happens: nothing of this may pass.
	if err := gatetest.WaitFence(ctx, orphan, "probe-aws", true); err != nil {
		t.Fatal(err)
	}
	run("native-ccm-aws", func(int) []attempt { return confinedWrites(wctx, awsCCM, "probe-hcloud", "") })
	run("native-ccm-orphan", func(int) []attempt { return confinedWrites(wctx, orphan, "probe-aws", svcNS) })
	soak("fence in force", 2*time.Second)

	phase.Store("kube-apiserver restarting")
	if err := e.RestartAPIServer(func() { time.Sleep(2 * time.Second) }); err != nil {
		t.Fatal(err)
	}
	soak("kube-apiserver restarted", window)

	phase.Store("NativeCCM CRD deleted")
	crds := dynamic.NewForConfigOrDie(e.Config).Resource(apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions"))
	if err := crds.Delete(ctx, "nativeccms.hybridccm.io", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := crds.Get(ctx, "nativeccms.hybridccm.io", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("the CRD stays: %v", err)
	}
	soak("NativeCCM CRD missing", window/2)
	phase.Store("NativeCCM CRD created again")
	applyManifests(t, ctx, e.Config, filepath.Join(root, "charts", "ccm-coordinator", "crds", "hybridccm.io_nativeccms.yaml"))
	createNativeCCM()
	soak("NativeCCM CRD created again", window/2)

	phase.Store("NativeCCM aws deleted")
	if err := c.Delete(ctx, awsObj.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	soak("NativeCCM aws deleted (its grant stays)", 3*time.Second)
	createNativeCCM()

	phase.Store("kube-apiserver restarting again")
	if err := e.RestartAPIServer(nil); err != nil {
		t.Fatal(err)
	}
	soak("kube-apiserver restarted again", window)
	waitOwnTaint(t, ctx, awsCCM, "after the restarts")
	r.complete = true
}

// attempt is one request and its answer.
type attempt struct {
	what string
	err  error
	// confined: the request must never pass.
	confined bool
}

// record collects what the writers saw.
type record struct {
	phase *atomic.Value
	mu    sync.Mutex
	// by phase: passed writes of the unconfined writers
	passed map[string]int
	// other errors by phase and kind (connection refused, authorizer not
	// ready, conflicts, ...): fine, but reported
	other    map[string]int
	failures []string
	// wrong counts the failures by phase and writer
	wrong map[string]int
	// complete: every state was driven through
	complete bool
}

func (r *record) add(who string, a attempt) {
	if errors.Is(a.err, context.Canceled) {
		return
	}
	p := r.phase.Load().(string)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.passed == nil {
		r.passed, r.other, r.wrong = map[string]int{}, map[string]int{}, map[string]int{}
	}
	switch {
	case a.confined && a.err == nil:
		r.failures = append(r.failures, fmt.Sprintf("[%s] %s: %s passed", p, who, a.what))
		r.wrong[p+": "+who+" passed"]++
	case a.confined:
		// refused, by whatever: fine
	case a.err == nil:
		r.passed[p]++
	case refusedByProduct(a.err):
		r.failures = append(r.failures, fmt.Sprintf("[%s] %s: %s refused: %v", p, who, a.what, a.err))
		r.wrong[p+": "+who+" refused"]++
	default:
		r.other[p+": "+kindOf(a.err)]++
	}
}

func (r *record) report(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range sortedKeys(r.passed) {
		t.Logf("passed %6d  %s", r.passed[k], k)
	}
	for _, k := range sortedKeys(r.other) {
		t.Logf("other  %6d  %s", r.other[k], k)
	}
	for _, k := range sortedKeys(r.wrong) {
		t.Logf("WRONG  %6d  %s", r.wrong[k], k)
	}
	for _, p := range []string{"static manifests applied", "kube-apiserver restarted", "NativeCCM CRD missing", "NativeCCM CRD created again", "kube-apiserver restarted again"} {
		if r.complete && r.passed[p] == 0 {
			t.Errorf("no write passed while %s: the test proves nothing about that state", p)
		}
	}
	if len(r.failures) > 0 {
		n := len(r.failures)
		if n > 20 {
			r.failures = r.failures[:20]
		}
		t.Errorf("%d writes were decided wrongly, the first ones:\n%s", n, strings.Join(r.failures, "\n"))
	}
}

func sortedKeys(m map[string]int) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}

// refusedByProduct: the error is a refusal by one of the product's
// admission policies (a denial, or the policy failing to configure).
func refusedByProduct(err error) bool {
	for _, p := range productPolicies {
		if strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+p+"'") {
			return true
		}
	}
	return false
}

// kindOf names an error that is no refusal of the product's, for the report.
func kindOf(err error) string {
	msg := err.Error()
	for _, k := range []string{"connection refused", "not yet ready to handle request", "is forbidden: User", "the object has been modified", "not found", "already exists", "EOF", "connection reset", "etcdserver", "timeout"} {
		if strings.Contains(msg, k) {
			return k
		}
	}
	if s := apierrors.ReasonForError(err); s != metav1.StatusReasonUnknown {
		return string(s)
	}
	if len(msg) > 80 {
		msg = msg[:80]
	}
	return msg
}

// nodeWrites is what a kubelet does to its Node (and an admin to any):
// register it, label it, report its status, and now and then delete it.
func nodeWrites(ctx context.Context, cs kubernetes.Interface, node string, i int, platform bool) []attempt {
	var out []attempt
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"kubernetes.io/hostname": node}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: names.UninitializedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}}}
	_, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		out = append(out, attempt{what: "create node " + node, err: err})
	}
	label := fmt.Sprintf(`{"metadata":{"labels":{"example.com/tick":"%d"}}}`, i)
	if platform {
		label = fmt.Sprintf(`{"metadata":{"labels":{"example.com/tick":"%d","%s":"aws"}}}`, i, names.PlatformLabel)
	}
	_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(label), metav1.PatchOptions{})
	out = append(out, attempt{what: "label node " + node, err: ignoreNotFound(err)})
	now := time.Now().UTC().Format(time.RFC3339)
	status := `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"` + now + `","lastTransitionTime":"` + now + `"}]}}`
	_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(status), metav1.PatchOptions{}, "status")
	out = append(out, attempt{what: "status of node " + node, err: ignoreNotFound(err)})
	if i%10 == 9 {
		err = cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
		out = append(out, attempt{what: "delete node " + node, err: ignoreNotFound(err)})
	}
	return out
}

// initializeWrites is talos-ccm initializing a node: platform label,
// providerID (dry run: it is write-once), the taint removed.
func initializeWrites(ctx context.Context, cs kubernetes.Interface, i int) []attempt {
	const node = "probe-hcloud"
	body := fmt.Sprintf(`{"metadata":{"labels":{"%s":"hcloud","topology.kubernetes.io/zone":"fsn1-%d"}}}`, names.PlatformLabel, i%3)
	_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{})
	return []attempt{{what: "initialize node " + node, err: err}}
}

// otherWrites are an admin's Service and ConfigMap writes: the fence matches
// Services, the coordinator's policy ConfigMaps, for every identity.
func otherWrites(ctx context.Context, cs kubernetes.Interface, namespace string, i int) []attempt {
	var out []attempt
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "admin-svc"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	_, err := cs.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		out = append(out, attempt{what: "create Service", err: err})
	}
	_, err = cs.CoreV1().Services(namespace).Patch(ctx, "admin-svc", types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"labels":{"tick":"%d"}}}`, i)), metav1.PatchOptions{})
	out = append(out, attempt{what: "label Service", err: ignoreNotFound(err)})
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "admin-cm"}, Data: map[string]string{"tick": fmt.Sprint(i)}}
	_, err = cs.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		out = append(out, attempt{what: "create ConfigMap", err: err})
	}
	if i%10 == 9 {
		out = append(out,
			attempt{what: "delete Service", err: ignoreNotFound(cs.CoreV1().Services(namespace).Delete(ctx, "admin-svc", metav1.DeleteOptions{}))},
			attempt{what: "delete ConfigMap", err: ignoreNotFound(cs.CoreV1().ConfigMaps(namespace).Delete(ctx, "admin-cm", metav1.DeleteOptions{}))})
	}
	return out
}

// confinedWrites are what a confined identity must never get through: on
// node (not its own), a label, its status, its deletion; with svcNS, the
// Services of svcNS too. All dry runs: a passing one changes nothing.
func confinedWrites(ctx context.Context, cs kubernetes.Interface, node, svcNS string) []attempt {
	dry := []string{metav1.DryRunAll}
	patch := func(body string, sub ...string) error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{DryRun: dry}, sub...)
		return err
	}
	out := []attempt{
		{what: "label node " + node + " control-plane", confined: true, err: patch(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`)},
		{what: "taint node " + node, confined: true, err: patch(`{"spec":{"taints":[{"key":"` + gate.ShutdownTaintKey + `","effect":"NoSchedule"}]}}`)},
		{what: "status of node " + node, confined: true, err: patch(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Probe"}]}}`, "status")},
		{what: "delete node " + node, confined: true, err: cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: dry})},
	}
	if svcNS == "" {
		return out
	}
	svcs := cs.CoreV1().Services(svcNS)
	_, errStatus := svcs.Patch(ctx, "probe-lb", types.StrategicMergePatchType,
		[]byte(`{"metadata":{"finalizers":["`+gate.LoadBalancerCleanupFinalizer+`"]},"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.1"}]}}}`), metav1.PatchOptions{DryRun: dry}, "status")
	_, errLabel := svcs.Patch(ctx, "probe-lb", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{DryRun: dry})
	_, errCreate := svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "probe-new"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
		metav1.CreateOptions{DryRun: dry})
	return append(out,
		attempt{what: "status of Service probe-lb", confined: true, err: errStatus},
		attempt{what: "label Service probe-lb", confined: true, err: errLabel},
		attempt{what: "create a Service", confined: true, err: errCreate},
		attempt{what: "delete Service probe-lb", confined: true, err: svcs.Delete(ctx, "probe-lb", metav1.DeleteOptions{DryRun: dry})},
	)
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// warmAdmissionMapper creates a ValidatingAdmissionPolicy with paramKind
// ConfigMap (for LimitRanges, which nobody writes here) and its binding: the
// API server looks its param kind up as it loads it.
func warmAdmissionMapper(t *testing.T, ctx context.Context, admin kubernetes.Interface) {
	t.Helper()
	const name = "test-params.example.com"
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			ParamKind:     &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
			FailurePolicy: ptr.To(admissionregistrationv1.Ignore),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"limitranges"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "true"}},
		}}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ParamRef: &admissionregistrationv1.ParamRef{Name: "limits", Namespace: "default",
				ParameterNotFoundAction: ptr.To(admissionregistrationv1.AllowAction)},
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitOwnTaint waits until the aws CCM may add the shutdown taint to its own
// node (dry run): the fence confines it, it does not shut it out.
func waitOwnTaint(t *testing.T, ctx context.Context, ccm kubernetes.Interface, when string) {
	t.Helper()
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := ccm.CoreV1().Nodes().Get(ctx, "probe-aws", metav1.GetOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		taints := append(n.Spec.Taints, corev1.Taint{Key: gate.ShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule})
		n.Spec.Taints = taints
		_, last = ccm.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil, nil
	}); err != nil {
		t.Errorf("%s: the aws CCM never got to taint its own node: %v", when, last)
	}
}

// applyManifests applies every object of the files with server-side apply,
// as kubectl apply --server-side does, retrying objects whose kind is not
// served yet (a CRD just created).
func applyManifests(t *testing.T, ctx context.Context, cfg *rest.Config, files ...string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery()))
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := chartstest.Parse(string(data))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, obj := range objs {
			if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				err := applyOne(ctx, dyn, mapper, obj)
				if meta.IsNoMatchError(err) {
					mapper.Reset()
					return false, nil
				}
				return err == nil, err
			}); err != nil {
				t.Fatalf("%s: apply %s %s: %v", filepath.Base(file), obj.GetKind(), obj.GetName(), err)
			}
		}
	}
}

func applyOne(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	ri := dynamic.ResourceInterface(dyn.Resource(mapping.Resource))
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	_, err = ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "kubectl", Force: true})
	return err
}
