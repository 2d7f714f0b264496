package oncluster

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
)

// ungatedSA is the identity of the ungated AWS CCM: not native-ccm-*, so
// neither the gate nor the fence knows it.
const (
	ungatedSA = "aws-ccm-ungated"
	// ungatedKey is its access key, so that the fake EC2's log tells its
	// calls from the gated CCMs'.
	ungatedKey = "AKIAUNGATEDCCM000001"
)

// TestUngatedCCMOfOneRegion is what the product prevents, on this cluster:
// the real AWS CCM of the second region (us-east-1), exactly as its release
// runs it — its image, arguments, cloud.conf and RBAC — but straight against
// the API server under an identity the fence does not match and with no
// gate, deletes the first region's NotReady node aws-1 whose instance runs
// in eu-west-1, because its region's EC2 endpoint does not know the instance
// (upstream cloud-provider-aws#939). The gated CCM of eu-west-1 kept the same
// node through its NotReady periods (TestOperations/InstanceTerminated): the
// fake EC2 answers by region as EC2 does, and the product's one CCM per
// region is what keeps the node.
//
// It runs last (go test runs a package's tests in the order of their files'
// names): it deletes aws-1 for good.
func TestUngatedCCMOfOneRegion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	install(t)
	chartstest.WaitNativeCCMRunning(t, ctx, f.Config, awsCCM2)
	const victim = "aws-1"

	// aws-1 powered off: NotReady, its instance running in eu-west-1.
	before, err := f.Client.CoreV1().Nodes().Get(ctx, victim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.PowerOff(victim); err != nil {
		t.Fatal(err)
	}
	waitNode(t, ctx, victim, "NotReady", func(o *corev1.Node) bool { return !ready(o) })
	if o, err := f.Client.CoreV1().Nodes().Get(ctx, victim, metav1.GetOptions{}); err != nil || o.UID != before.UID {
		t.Fatalf("%s before the ungated CCM started: %v (uid %v, was %s)", victim, err, o.UID, before.UID)
	}

	pod := ungatedPod(t, ctx)
	started := time.Now()
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := f.Client.CoreV1().Nodes().Get(ctx, victim, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		logs, _ := f.PodLogs(ctx, ccmNamespace, pod, "cloud-controller-manager")
		t.Fatalf("the ungated us-east-1 CCM did not delete %s (its instance runs in eu-west-1); its logs:\n%s", victim, tail(logs, 40))
	}
	t.Logf("the ungated %s CCM deleted %s %s after it started", awsRegion2, victim, time.Since(started).Round(time.Second))

	// It said so, and it asked its own region's endpoint about aws-1's
	// instance; it was never told about it by eu-west-1.
	logs, err := f.PodLogs(ctx, ccmNamespace, pod, "cloud-controller-manager")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(strings.Split(logs, "\n"), func(l string) bool {
		return strings.Contains(l, `object="`+victim+`"`) && strings.Contains(l, `reason="DeletingNode"`)
	}) {
		t.Errorf("the ungated CCM's logs do not record deleting %s:\n%s", victim, tail(logs, 40))
	}
	var own, elsewhere []string
	for _, c := range clouds.EC2.Calls() {
		if c.Service == fakeec2.IMDS || c.AccessKey != ungatedKey {
			continue
		}
		switch {
		case c.Region != awsRegion2:
			elsewhere = append(elsewhere, c.String())
		case ec2About(c, victim):
			own = append(own, c.String())
		}
	}
	if len(own) == 0 {
		t.Errorf("the ungated CCM never asked %s's EC2 endpoint about %s's instance", awsRegion2, victim)
	}
	if len(elsewhere) > 0 {
		t.Errorf("the ungated CCM of %s called other regions' endpoints: %v", awsRegion2, elsewhere)
	}
	t.Logf("its questions about %s, all to %s: %s", victim, awsRegion2, strings.Join(slices.Compact(own), "; "))
	// The gated CCMs' calls stayed in their regions all along.
	var gated []fakeec2.Call
	for _, c := range clouds.EC2.Calls() {
		if c.AccessKey != ungatedKey {
			gated = append(gated, c)
		}
	}
	for _, c := range gated {
		if c.Service != fakeec2.IMDS && ec2About(c, victim) && c.Region != awsRegion {
			t.Errorf("gated EC2 call %s about %s sent to %s", c, victim, c.Region)
		}
	}
}

// ungatedPod starts a Pod from the pod template of the second region's
// release with the gate taken out: the CCM container alone, its kubeconfig
// flags (which named the gate) gone so that it uses the pod's own token,
// its own lease and access key, and a ServiceAccount bound to everything the
// release's is. It returns the pod's name; the pod, the ServiceAccount and
// the bindings go when the test ends.
func ungatedPod(t *testing.T, ctx context.Context) string {
	t.Helper()
	release := "native-ccm-" + awsCCM2
	d, err := f.Client.AppsV1().Deployments(ccmNamespace).Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	copyBindings(t, ctx, release)

	spec := *d.Spec.Template.Spec.DeepCopy()
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "cloud-controller-manager" })
	if i < 0 {
		t.Fatalf("deployment %s has no cloud-controller-manager container: %+v", release, spec.Containers)
	}
	ccm := spec.Containers[i]
	gateVolumes := map[string]bool{}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if c.Name == ccm.Name {
			continue
		}
		for _, m := range c.VolumeMounts {
			gateVolumes[m.Name] = true
		}
	}
	var args []string
	for _, a := range ccm.Args {
		switch {
		case strings.HasPrefix(a, "--kubeconfig="), strings.HasPrefix(a, "--authentication-kubeconfig="), strings.HasPrefix(a, "--authorization-kubeconfig="):
			for _, m := range ccm.VolumeMounts {
				if strings.HasPrefix(a[strings.Index(a, "=")+1:], m.MountPath) {
					gateVolumes[m.Name] = true
				}
			}
		case strings.HasPrefix(a, "--leader-elect-resource-name="):
			args = append(args, "--leader-elect-resource-name="+ungatedSA)
		default:
			args = append(args, a)
		}
	}
	ccm.Args = args
	ccm.VolumeMounts = slices.DeleteFunc(ccm.VolumeMounts, func(m corev1.VolumeMount) bool { return gateVolumes[m.Name] })
	keySet := false
	for j, e := range ccm.Env {
		if e.Name == "AWS_ACCESS_KEY_ID" {
			ccm.Env[j] = corev1.EnvVar{Name: e.Name, Value: ungatedKey}
			keySet = true
		}
	}
	if !keySet {
		t.Fatalf("the CCM container of %s takes no AWS_ACCESS_KEY_ID from the environment: %+v", release, ccm.Env)
	}
	spec.Containers = []corev1.Container{ccm}
	spec.InitContainers = nil
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return gateVolumes[v.Name] })
	automount := true
	spec.AutomountServiceAccountToken = &automount
	spec.ServiceAccountName = ungatedSA
	spec.RestartPolicy = corev1.RestartPolicyNever

	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ungatedSA, Namespace: ccmNamespace}}
	if _, err := f.Client.CoreV1().ServiceAccounts(ccmNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.Client.CoreV1().ServiceAccounts(ccmNamespace).Delete(context.Background(), ungatedSA, metav1.DeleteOptions{})
	})
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: ungatedSA, Namespace: ccmNamespace, Labels: map[string]string{"app.kubernetes.io/name": ungatedSA}}, Spec: spec}
	if _, err := f.Client.CoreV1().Pods(ccmNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = f.Client.CoreV1().Pods(ccmNamespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	return p.Name
}

// copyBindings binds ungatedSA to every role the ServiceAccount sa of
// ccmNamespace is bound to, cluster-wide and in every namespace.
func copyBindings(t *testing.T, ctx context.Context, sa string) {
	t.Helper()
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: ungatedSA, Namespace: ccmNamespace}
	bound := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == ccmNamespace
		})
	}
	crbs, err := f.Client.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range crbs.Items {
		if !bound(b.Subjects) {
			continue
		}
		c := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ungatedSA + "-" + b.Name}, RoleRef: b.RoleRef, Subjects: []rbacv1.Subject{subject}}
		if _, err := f.Client.RbacV1().ClusterRoleBindings().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = f.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
		})
		n++
	}
	rbs, err := f.Client.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range rbs.Items {
		if !bound(b.Subjects) {
			continue
		}
		c := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ungatedSA + "-" + b.Name, Namespace: b.Namespace}, RoleRef: b.RoleRef, Subjects: []rbacv1.Subject{subject}}
		if _, err := f.Client.RbacV1().RoleBindings(b.Namespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = f.Client.RbacV1().RoleBindings(c.Namespace).Delete(context.Background(), c.Name, metav1.DeleteOptions{})
		})
		n++
	}
	if n == 0 {
		t.Fatalf("ServiceAccount %s/%s is bound to nothing", ccmNamespace, sa)
	}
	// The release may hold only its own lease (by name); the ungated CCM
	// leads under its own, so that it does not wait for the gated one.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: ungatedSA + "-lease", Namespace: ccmNamespace}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{ungatedSA}, Verbs: []string{"get", "update"}},
	}}
	if _, err := f.Client.RbacV1().Roles(ccmNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: ccmNamespace}, Subjects: []rbacv1.Subject{subject},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}}
	if _, err := f.Client.RbacV1().RoleBindings(ccmNamespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.Client.RbacV1().RoleBindings(ccmNamespace).Delete(context.Background(), rb.Name, metav1.DeleteOptions{})
		_ = f.Client.RbacV1().Roles(ccmNamespace).Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
