// Package gatetest holds the fixtures the gate's tests, the chaos test and the
// gate benchmarks share: a native CCM identity with exactly the RBAC the
// coordinator grants, nodes of several platforms, and waiting for the fence to
// become active. Everything talks to the real API server of test/testenv.
//
// It is for tests only and must not be imported by production code.
package gatetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Username is the API server user name of a ServiceAccount.
func Username(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// ServiceAccountUser returns a client configuration authenticated (by client
// certificate) as the ServiceAccount namespace/name, with the groups the API
// server gives ServiceAccounts.
func ServiceAccountUser(e *testenv.Env, namespace, name string) (*rest.Config, error) {
	cfg, err := e.AddUser(Username(namespace, name), "system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = -1, -1
	return cfg, nil
}

// ServiceAccountToken creates the ServiceAccount (if needed) and returns a bound
// token for it from the TokenRequest API: the credential a pod really has.
func ServiceAccountToken(ctx context.Context, cs kubernetes.Interface, namespace, name string) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// GrantNativeCCM gives the ServiceAccount namespace/name more than the
// coordinator grants a native CCM: nodes get/list/watch/patch/update/delete,
// nodes/status patch/update, events create/patch, and leases in its namespace
// get/create/update. The fence and proxy tests use it so that RBAC lets every
// write they try reach admission (the fence must hold even for a CCM whose
// RBAC is broader); GrantLifecycle is exactly what the coordinator grants.
func GrantNativeCCM(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	return grant(ctx, cs, namespace, name, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch", "update", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch", "update"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	})
}

// GrantLifecycle gives the ServiceAccount namespace/name exactly the
// cluster-wide RBAC the coordinator grants every native CCM
// (release.LifecycleRules), plus leases in its namespace.
func GrantLifecycle(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	return grant(ctx, cs, namespace, name, release.LifecycleRules())
}

// LoadBalancerRules are what the service controller of k8s.io/cloud-provider
// needs on Services: read them, and write their status and its finalizer
// (both through services/status), plus the PUTs and PATCHes of Services the
// gate's tests try.
func LoadBalancerRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch", "patch", "update"}},
		{APIGroups: []string{""}, Resources: []string{"services/status"}, Verbs: []string{"patch", "update"}},
	}
}

// GrantLoadBalancers adds LoadBalancerRules to the ServiceAccount
// namespace/name (ClusterRole and binding <name>-load-balancers).
func GrantLoadBalancers(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	role := name + "-load-balancers"
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: LoadBalancerRules(),
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("grant load balancers to %s/%s: %w", namespace, name, err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("grant load balancers to %s/%s: %w", namespace, name, err)
	}
	return waitGranted(ctx, cs, namespace, name, authorizationv1.ResourceAttributes{Verb: "patch", Resource: "services", Subresource: "status"})
}

// waitGranted waits until the API server's authorizer lets the
// ServiceAccount namespace/name do what attrs says: RBAC reads Roles and
// bindings from an informer, so a grant just created can still be unknown to
// it (a request in that moment is refused as "clusterrole ... not found",
// before any admission check a test means to look at).
func waitGranted(ctx context.Context, cs kubernetes.Interface, namespace, name string, attrs authorizationv1.ResourceAttributes) error {
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               Username(namespace, name),
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		ResourceAttributes: &attrs,
	}}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		last = got.Status.Reason
		return got.Status.Allowed, nil
	})
	if err != nil {
		return fmt.Errorf("grant to %s/%s: %s %s/%s not allowed yet (%s): %w", namespace, name, attrs.Verb, attrs.Resource, attrs.Subresource, last, err)
	}
	return nil
}

func grant(ctx context.Context, cs kubernetes.Interface, namespace, name string, rules []rbacv1.PolicyRule) error {
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}}
	objs := []func() error{
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Rules:      rules,
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
				Subjects:   subjects,
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().Roles(namespace).Create(ctx, &rbacv1.Role{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
				},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
				Subjects:   subjects,
			}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objs {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("grant native CCM %s/%s: %w", namespace, name, err)
		}
	}
	if len(rules) == 0 || len(rules[0].Verbs) == 0 || len(rules[0].Resources) == 0 {
		return nil
	}
	group := ""
	if len(rules[0].APIGroups) > 0 {
		group = rules[0].APIGroups[0]
	}
	resource, sub, _ := strings.Cut(rules[0].Resources[0], "/")
	if err := waitGranted(ctx, cs, namespace, name, authorizationv1.ResourceAttributes{Verb: rules[0].Verbs[0], Group: group, Resource: resource, Subresource: sub}); err != nil {
		return err
	}
	return waitGranted(ctx, cs, namespace, name, authorizationv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: namespace})
}

// NodeSpec describes a test node.
type NodeSpec struct {
	// Name of the node.
	Name string
	// Platform is the platform label value; empty: no label (uninitialized).
	Platform string
	// ProviderID; empty: none.
	ProviderID string
	// Ready sets the Ready condition True; otherwise False (NotReady).
	Ready bool
	// Labels are extra labels.
	Labels map[string]string
}

// Node renders the spec as a Node object.
func (s NodeSpec) Node() *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Labels: map[string]string{"kubernetes.io/hostname": s.Name}}}
	for k, v := range s.Labels {
		n.Labels[k] = v
	}
	if s.Platform != "" {
		n.Labels[names.PlatformLabel] = s.Platform
	} else {
		n.Spec.Taints = []corev1.Taint{{Key: names.UninitializedTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	}
	n.Spec.ProviderID = s.ProviderID
	return n
}

// CreateNodes creates the nodes and sets their Ready condition, a few at a
// time.
func CreateNodes(ctx context.Context, cs kubernetes.Interface, specs ...NodeSpec) error {
	return Parallel(len(specs), 16, func(i int) error { return createNode(ctx, cs, specs[i]) })
}

// Parallel calls fn(i) for every i in [0, n) on workers goroutines, hands out
// no more work after the first error, and returns it.
func Parallel(n, workers int, fn func(i int) error) error {
	work := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range n {
		select {
		case work <- i:
		case err = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	if err != nil {
		return err
	}
	return <-errs
}

func createNode(ctx context.Context, cs kubernetes.Interface, s NodeSpec) error {
	n, err := cs.CoreV1().Nodes().Create(ctx, s.Node(), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", s.Name, err)
	}
	status := corev1.ConditionFalse
	if s.Ready {
		status = corev1.ConditionTrue
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: status, Reason: "Test",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", s.Name, err)
	}
	return nil
}

// DeleteNodes removes the nodes matching a label selector and waits until they
// are gone.
func DeleteNodes(ctx context.Context, cs kubernetes.Interface, selector string) error {
	if err := cs.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: selector}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector, Limit: 1})
		return err == nil && len(l.Items) == 0, err
	})
}

// DeleteAllNodes removes every node and waits until none is left.
func DeleteAllNodes(ctx context.Context, cs kubernetes.Interface) error {
	if err := cs.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, err
	})
}

// FenceDenies reports whether the fence denies the native CCM a dry-run patch of
// a (foreign) node: the probe for "the policy is active". Dry-run requests go
// through admission, and nothing changes either way.
func FenceDenies(ctx context.Context, ccm kubernetes.Interface, node string) (bool, error) {
	_, err := ccm.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType,
		[]byte(`{"metadata":{"annotations":{"hybridccm.io/fence-probe":"x"}}}`),
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return false, nil
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "hybrid-ccm gate"):
		return true, nil
	default:
		return false, err
	}
}

// WaitFence polls FenceDenies until it equals active (a new or removed policy
// takes the API server up to about a second).
func WaitFence(ctx context.Context, ccm kubernetes.Interface, node string, active bool) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		denied, err := FenceDenies(ctx, ccm, node)
		if err != nil {
			return false, err
		}
		return denied == active, nil
	})
}

// WaitFenceAllows polls a dry-run write the fence must allow until it is
// allowed. WaitFence(..., true) alone is also met by a fence of an earlier
// test still in effect (a policy change takes the API server up to about a
// second), which denies for its own reasons; a write only the current fence
// allows says the current one is in effect.
func WaitFenceAllows(ctx context.Context, write func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = write()
		switch {
		case last == nil:
			return true, nil
		case apierrors.IsForbidden(last) && strings.Contains(last.Error(), "hybrid-ccm gate"):
			return false, nil
		default:
			return false, last
		}
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return err
}

// WriteKubeconfig writes cfg (host, CA, client certificate or token) as a
// kubeconfig file, for a ccm-gate run as a subprocess or through proxy.Serve.
func WriteKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile,
		Token: cfg.BearerToken,
	}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}
