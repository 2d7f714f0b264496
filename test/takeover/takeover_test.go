package takeover

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/test/fakeec2"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleetcheck"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet/fleethelm"
)

const (
	// namespace is where the AWS CCM's chart and the umbrella chart are
	// installed (docs/install.md), ccmNamespace the coordinator's.
	namespace    = "kube-system"
	ccmNamespace = "hybrid-ccm-system"
	// previous is the AWS CCM's release, DaemonSet and credentials Secret
	// (the chart's nameOverride), previousLease its Lease in namespace:
	// k8s.io/cloud-provider's default.
	previous      = "aws-cloud-controller-manager"
	previousLease = "cloud-controller-manager"
	// previousKey and nativeKey are the two CCMs' access keys: the fake
	// EC2's log tells their calls apart by them (fleetcheck's Secret gives
	// the native CCM its key).
	previousKey = "AKIAPREVIOUSAWSCCM001"
	nativeKey   = "AKIAFAKEHYBRIDCCM"
	// nativeCCM is the NativeCCM of testdata/values.yaml.
	nativeCCM = "aws"
	// zoneIDLabel is set by the AWS CCM's cloud-node controller, never by
	// talos-ccm: it tells who initialized a node.
	zoneIDLabel = "topology.k8s.aws/zone-id"
	// svcNamespace/svcName is the LoadBalancer Service without a class.
	svcNamespace, svcName = "shop", "web"
)

// TestTakeOverFromTheAWSCCM: a cluster runs the upstream AWS CCM as its own
// chart installs it (a DaemonSet in kube-system, every controller, Lease
// kube-system/cloud-controller-manager); it initialized the aws nodes and
// serves a Service without a class with a Classic ELB. Hybrid CCM is
// installed as docs/migrating-from-a-cloud-ccm.md says, while the AWS CCM
// still runs: talos-ccm (enforce mode) routes the initialized nodes, the aws
// NativeCCM waits (WaitingForPreviousCCM, naming the Lease and the AWS CCM's
// pod) and nothing of it runs. The AWS CCM is uninstalled: once its Lease
// runs out the native AWS CCM is installed, gated, and takes the Service
// over. Throughout: no node deleted, re-registered or tainted uninitialized
// again; the same ELB (no CreateLoadBalancer or DeleteLoadBalancer after
// the install began, the Service's address unchanged); every call of the
// AWS CCM to the fake AWS APIs before the first of the native one, and the
// native one's Lease taken after the AWS CCM's ran out. A node that joins
// afterwards is initialized by talos-ccm and served by the native CCM.
func TestTakeOverFromTheAWSCCM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	clouds, err := f.StartClouds(fleet.CloudOptions{AWSRegion: region})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = clouds.Close() })
	var awsNodes []fleet.Machine
	for _, m := range machines {
		if m.Platform == "aws" {
			awsNodes = append(awsNodes, m)
		}
	}

	// 1. The AWS CCM, as the cluster runs it: its chart, unmodified.
	installPrevious(t, ctx, clouds)
	for _, m := range awsNodes {
		n := fleetcheck.WaitNode(t, ctx, f, m, "initialized by the AWS CCM", func(n *corev1.Node) bool {
			return !uninitialized(n) && n.Spec.ProviderID != "" && n.Labels[zoneIDLabel] != ""
		})
		if n.Spec.ProviderID != m.ProviderID || n.Labels[names.PlatformLabel] != "" {
			t.Fatalf("node %s: providerID %q, platform label %q: want the AWS CCM's %s and none", m.Name, n.Spec.ProviderID, n.Labels[names.PlatformLabel], m.ProviderID)
		}
	}
	previousPod := runningPod(t, ctx, namespace, "k8s-app="+previous)
	lease := waitLease(t, ctx, namespace, previousLease, "held by the AWS CCM's pod "+previousPod, func(l *coordinationv1.Lease) bool {
		return strings.HasPrefix(ptrString(l.Spec.HolderIdentity), previousPod+"_")
	})
	t.Logf("the AWS CCM (pod %s) initialized %d aws nodes and leads: Lease %s/%s held by %s", previousPod, len(awsNodes), namespace, previousLease, ptrString(lease.Spec.HolderIdentity))

	// A Service without a class: the AWS CCM builds its Classic ELB.
	elb := serveService(t, ctx, clouds, awsNodes)
	svc, err := f.Client.CoreV1().Services(svcNamespace).Get(ctx, svcName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ingress := svc.Status.LoadBalancer.Ingress
	t.Logf("Service %s/%s: Classic ELB %s (%s) targeting %v", svcNamespace, svcName, elb.Name, elb.DNSName, elb.Instances)

	// What must hold from here on.
	before := nodeRecords(t, ctx)
	watch := watchNodes(t, ctx)
	began := len(clouds.EC2.Calls())

	// 2. Hybrid CCM, while the AWS CCM runs (docs/migrating-from-a-cloud-ccm.md).
	values := readValues(t)
	if err := fleethelm.Install(ctx, f, namespace, "hybrid-ccm", f.ChartRef("hybrid-ccm"), version, values); err != nil {
		t.Fatal(err)
	}
	if err := fleetcheck.CredentialsSecrets(ctx, f, clouds, ccmNamespace, false); err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(ctx, 2*time.Minute)
	defer acancel()
	if err := f.AnswerTalosServiceAccount(actx, namespace, "talos-ccm-talos"); err != nil {
		t.Fatal(err)
	}
	// talos-ccm's enforce mode routes the nodes the AWS CCM initialized and
	// initializes the control plane, which no CCM knew.
	t.Cleanup(func() {
		if t.Failed() {
			talosCCMLogs(t)
		}
	})
	for _, m := range machines {
		fleetcheck.WaitNode(t, ctx, f, m, "routed to its platform", func(n *corev1.Node) bool {
			return !uninitialized(n) && n.Labels[names.PlatformLabel] == m.Platform
		})
	}
	// The NativeCCM waits for the AWS CCM, naming its Lease and pod.
	waiting := waitNativeCCM(t, ctx, "Ready=False WaitingForPreviousCCM", func(n *v1.NativeCCM) bool {
		c := apimeta.FindStatusCondition(n.Status.Conditions, "Ready")
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.WaitingForPreviousCCMReason
	})
	msg := apimeta.FindStatusCondition(waiting.Status.Conditions, "Ready").Message
	for _, want := range []string{"Lease " + namespace + "/" + previousLease, `held by "` + previousPod + "_", "uninstall it"} {
		if !strings.Contains(msg, want) {
			t.Errorf("WaitingForPreviousCCM message %q lacks %q", msg, want)
		}
	}
	if !eventOf(t, ctx, v1.WaitingForPreviousCCMReason) {
		t.Errorf("no %s event on NativeCCM %s", v1.WaitingForPreviousCCMReason, nativeCCM)
	}
	t.Logf("NativeCCM %s: %s", nativeCCM, msg)
	// It keeps waiting as long as the AWS CCM runs: through more than one of
	// its lease durations, nothing of the native CCM exists or calls AWS.
	d := time.Duration(ptrInt(lease.Spec.LeaseDurationSeconds)) * time.Second
	for end := time.Now().Add(d + 5*time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if why := nativeRuns(t, ctx, clouds); why != "" {
			t.Fatalf("the native AWS CCM runs beside the AWS CCM: %s", why)
		}
	}
	if n := chartstest.NativeCCM(t, ctx, f.Config, nativeCCM); !apimeta.IsStatusConditionFalse(n.Status.Conditions, "Ready") ||
		apimeta.FindStatusCondition(n.Status.Conditions, "Ready").Reason != v1.WaitingForPreviousCCMReason {
		t.Fatalf("NativeCCM %s stopped waiting while the AWS CCM runs: %+v", nativeCCM, n.Status.Conditions)
	}

	// 3. helm uninstall aws-cloud-controller-manager -n kube-system, as the
	// doc says; its pod stops without releasing the Lease.
	if err := fleethelm.Uninstall(f, namespace, previous); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := f.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=" + previous})
		return err == nil && len(pods.Items) == 0, nil
	}); err != nil {
		t.Fatalf("the AWS CCM's pod is not gone: %v", err)
	}
	stopped := time.Now()
	last, err := f.Client.CoordinationV1().Leases(namespace).Get(ctx, previousLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// 4. The native AWS CCM takes over.
	running := chartstest.WaitNativeCCMRunning(t, ctx, f.Config, nativeCCM)
	if !eventOf(t, ctx, v1.PreviousCCMStoppedReason) {
		t.Errorf("no %s event on NativeCCM %s", v1.PreviousCCMStoppedReason, nativeCCM)
	}
	t.Logf("the native AWS CCM leads %s after the AWS CCM's pod was gone (its Lease was last renewed %s before it)",
		time.Since(stopped).Round(time.Second), stopped.Sub(last.Spec.RenewTime.Time).Round(time.Second))
	// Its Lease was taken only after the AWS CCM's ran out.
	native, err := f.Client.CoordinationV1().Leases(ccmNamespace).Get(ctx, running.ReleaseName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ranOut := last.Spec.RenewTime.Add(time.Duration(ptrInt(last.Spec.LeaseDurationSeconds)) * time.Second)
	if native.Spec.AcquireTime == nil || native.Spec.AcquireTime.Time.Before(ranOut) {
		t.Errorf("Lease %s/%s acquired at %v, before the AWS CCM's Lease ran out at %v", ccmNamespace, native.Name, native.Spec.AcquireTime, ranOut)
	}
	// It serves the Service: its service controller looks at the ELB.
	waitFor(t, ctx, "the native AWS CCM's first Elastic Load Balancing call", func() (bool, string) {
		return slices.ContainsFunc(clouds.EC2.Calls(), func(c fakeec2.Call) bool { return c.Service == fakeec2.ELB && c.AccessKey == nativeKey }), ""
	})

	// 5. A machine joins: talos-ccm initializes it, the native CCM owns it
	// and puts it behind the ELB.
	if err := f.AddMachine(ctx, joining); err != nil {
		t.Fatal(err)
	}
	n := fleetcheck.WaitNode(t, ctx, f, joining, "initialized by talos-ccm", func(n *corev1.Node) bool {
		return !uninitialized(n) && n.Labels[names.PlatformLabel] == "aws"
	})
	if n.Spec.ProviderID != joining.ProviderID || n.Labels[zoneIDLabel] != "" {
		t.Errorf("node %s: providerID %q, %s=%q: want talos-ccm's %s and no AWS CCM label", n.Name, n.Spec.ProviderID, zoneIDLabel, n.Labels[zoneIDLabel], joining.ProviderID)
	}
	waitNativeCCM(t, ctx, "owning 3 nodes", func(n *v1.NativeCCM) bool {
		return n.Status.Nodes == 3 && apimeta.IsStatusConditionTrue(n.Status.Conditions, v1.NodesOwnedCondition)
	})
	want := []string{machines[1].Name, machines[2].Name, joining.Name}
	waitFor(t, ctx, "the joining instance behind the ELB", func() (bool, string) {
		lb, ok := loadBalancer(clouds)
		got := slices.Sorted(slices.Values(lb.Instances))
		return ok && lb.Name == elb.Name && slices.Equal(got, want), fmt.Sprintf("%+v", lb)
	})

	// 6. What held all along.
	watch.stop()
	for _, e := range watch.errors() {
		t.Error(e)
	}
	after := nodeRecords(t, ctx)
	for name, r := range before {
		a := after[name]
		if r.providerID == "" {
			// the control plane, which no CCM could initialize before talos-ccm
			a.providerID = ""
		}
		if a != r {
			t.Errorf("node %s was %+v before the install, is %+v", name, r, after[name])
		}
	}
	calls := clouds.EC2.Calls()
	for _, c := range calls[began:] {
		if c.Service == fakeec2.ELB && (c.Action == "CreateLoadBalancer" || c.Action == "DeleteLoadBalancer") {
			t.Errorf("%s by %s after the install began", c, c.AccessKey)
		}
	}
	if lbs := clouds.EC2.LoadBalancers(); len(lbs) != 1 || lbs[0].Name != elb.Name || lbs[0].DNSName != elb.DNSName {
		t.Errorf("load balancers %+v, want only %s (%s)", lbs, elb.Name, elb.DNSName)
	}
	svc, err = f.Client.CoreV1().Services(svcNamespace).Get(ctx, svcName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(svc.Status.LoadBalancer.Ingress) != fmt.Sprint(ingress) {
		t.Errorf("Service %s/%s ingress %v, was %v", svcNamespace, svcName, svc.Status.LoadBalancer.Ingress, ingress)
	}
	lastPrevious, firstNative, previousCalls, nativeCalls := -1, -1, 0, 0
	for i, c := range calls {
		switch c.AccessKey {
		case previousKey:
			lastPrevious = i
			previousCalls++
		case nativeKey:
			if firstNative < 0 {
				firstNative = i
			}
			nativeCalls++
		}
	}
	if previousCalls == 0 || nativeCalls == 0 || lastPrevious > firstNative {
		t.Errorf("the AWS CCM's calls (%d, the last #%d) and the native one's (%d, the first #%d) overlap: two CCMs served at once", previousCalls, lastPrevious, nativeCalls, firstNative)
	} else {
		t.Logf("the AWS CCM made %d calls to the fake AWS APIs, all before the first of the native AWS CCM's %d (#%d, #%d)", previousCalls, nativeCalls, lastPrevious, firstNative)
	}
}

// installPrevious installs the AWS CCM with its own chart from the module
// cache, and its credentials and cloud.conf in a Secret of kube-system.
func installPrevious(t *testing.T, ctx context.Context, clouds *fleet.Clouds) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: previous, Namespace: namespace}, StringData: map[string]string{
		"access-key-id": previousKey, "secret-access-key": "previous-secret", "cloud.conf": clouds.AWSCloudConf()}}
	if _, err := f.Client.CoreV1().Secrets(namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	chart, err := fleet.AWSCCMChart(ctx, awsCCM)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := fleet.AWSCCMTag(awsCCM)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	b, err := os.ReadFile(filepath.Join("testdata", previous+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &vals); err != nil {
		t.Fatal(err)
	}
	vals["image"] = map[string]any{"tag": tag}
	if err := fleethelm.InstallChart(ctx, f, namespace, previous, chart, vals); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install %s %s -n %s (image tag %s)", previous, chart, namespace, tag)
}

// serveService creates the Service without a class and waits for its
// Classic ELB: targeting the aws instances, its DNS name the Service's
// address.
func serveService(t *testing.T, ctx context.Context, clouds *fleet.Clouds, aws []fleet.Machine) fakeec2.LoadBalancer {
	t.Helper()
	if _, err := f.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: svcNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: svcNamespace},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": svcName}, Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := f.Client.CoreV1().Services(svcNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, m := range aws {
		want = append(want, m.Name)
	}
	var lb fakeec2.LoadBalancer
	waitFor(t, ctx, "the Service's Classic ELB", func() (bool, string) {
		got, err := f.Client.CoreV1().Services(svcNamespace).Get(ctx, svcName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var ok bool
		lb, ok = loadBalancer(clouds)
		ing := got.Status.LoadBalancer.Ingress
		return ok && len(ing) == 1 && ing[0].Hostname == lb.DNSName && slices.Equal(slices.Sorted(slices.Values(lb.Instances)), want),
			fmt.Sprintf("ingress %v, load balancer %+v", ing, lb)
	})
	for _, c := range clouds.EC2.Calls() {
		if c.Service == fakeec2.ELB && c.Action == "CreateLoadBalancer" && c.AccessKey != previousKey {
			t.Fatalf("%s by %s, not the AWS CCM", c, c.AccessKey)
		}
	}
	return lb
}

// loadBalancer is the Service's Classic ELB in the fake EC2.
func loadBalancer(clouds *fleet.Clouds) (fakeec2.LoadBalancer, bool) {
	for _, lb := range clouds.EC2.LoadBalancers() {
		if lb.Tags["kubernetes.io/service-name"] == svcNamespace+"/"+svcName {
			return lb, true
		}
	}
	return fakeec2.LoadBalancer{}, false
}

// nativeRuns says what of the native AWS CCM exists or acts ("" nothing):
// its release, Deployment, pods or a call with its access key.
func nativeRuns(t *testing.T, ctx context.Context, clouds *fleet.Clouds) string {
	t.Helper()
	rel := v1.ReleasePrefix + nativeCCM
	if n := chartstest.NativeCCM(t, ctx, f.Config, nativeCCM); n.Status.Release != nil {
		return fmt.Sprintf("NativeCCM %s records release %+v", nativeCCM, n.Status.Release)
	}
	if _, err := f.Client.AppsV1().Deployments(ccmNamespace).Get(ctx, rel, metav1.GetOptions{}); err == nil {
		return "Deployment " + ccmNamespace + "/" + rel + " exists"
	}
	if pods, err := f.Client.CoreV1().Pods(ccmNamespace).List(ctx, metav1.ListOptions{LabelSelector: "hybridccm.io/native-ccm=" + rel}); err == nil && len(pods.Items) > 0 {
		return fmt.Sprintf("%d pod(s) of %s", len(pods.Items), rel)
	}
	for _, c := range clouds.EC2.Calls() {
		if c.AccessKey == nativeKey {
			return "it called " + c.String()
		}
	}
	return ""
}

// nodeRecord is what a node must keep through the take-over.
type nodeRecord struct {
	uid, providerID string
	created         time.Time
}

func nodeRecords(t *testing.T, ctx context.Context) map[string]nodeRecord {
	t.Helper()
	list, err := f.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]nodeRecord{}
	for _, n := range list.Items {
		out[n.Name] = nodeRecord{uid: string(n.UID), providerID: n.Spec.ProviderID, created: n.CreationTimestamp.Time}
	}
	return out
}

// nodeWatch records every deletion of a node, and every node that gets the
// uninitialized taint again after it lost it.
type nodeWatch struct {
	stopCh chan struct{}
	mu     sync.Mutex
	errs   []string
}

func watchNodes(t *testing.T, ctx context.Context) *nodeWatch {
	t.Helper()
	w := &nodeWatch{stopCh: make(chan struct{})}
	factory := informers.NewSharedInformerFactory(f.Client, 0)
	inf := factory.Core().V1().Nodes().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(o, n any) {
			if old, cur := o.(*corev1.Node), n.(*corev1.Node); !uninitialized(old) && uninitialized(cur) {
				w.fail("node %s tainted uninitialized again: %v", cur.Name, cur.Spec.Taints)
			}
		},
		DeleteFunc: func(o any) { w.fail("node %v deleted", o) },
	})
	factory.Start(w.stopCh)
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("watch: %v not synced", typ)
		}
	}
	return w
}

func (w *nodeWatch) fail(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, fmt.Sprintf(format, args...))
}

func (w *nodeWatch) stop() { close(w.stopCh) }

func (w *nodeWatch) errors() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.errs)
}

func uninitialized(n *corev1.Node) bool { return names.Uninitialized(n.Spec.Taints) }

// talosCCMLogs logs the end of talos-ccm's log, for a failure.
func talosCCMLogs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := f.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=talos-ccm"})
	if err != nil {
		t.Logf("talos-ccm's pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		logs, err := f.PodLogs(ctx, namespace, p.Name, p.Spec.Containers[0].Name)
		if err != nil {
			t.Logf("talos-ccm pod %s: %v", p.Name, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
		t.Logf("talos-ccm pod %s, the last %d lines of its log:\n%s", p.Name, min(len(lines), 80), strings.Join(lines[max(0, len(lines)-80):], "\n"))
	}
}

// runningPod is the name of the one running pod the selector selects.
func runningPod(t *testing.T, ctx context.Context, ns, selector string) string {
	t.Helper()
	var name string
	waitFor(t, ctx, "a running pod "+selector, func() (bool, string) {
		pods, err := f.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		var state []string
		for _, p := range pods.Items {
			state = append(state, p.Name+" "+string(p.Status.Phase))
			if p.Status.Phase == corev1.PodRunning {
				name = p.Name
			}
		}
		return len(pods.Items) == 1 && name != "", strings.Join(state, ", ")
	})
	return name
}

func waitLease(t *testing.T, ctx context.Context, ns, name, what string, cond func(*coordinationv1.Lease) bool) *coordinationv1.Lease {
	t.Helper()
	var l *coordinationv1.Lease
	waitFor(t, ctx, "Lease "+ns+"/"+name+" "+what, func() (bool, string) {
		var err error
		if l, err = f.Client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, err.Error()
		}
		return cond(l), fmt.Sprintf("%+v", l.Spec)
	})
	return l
}

func waitNativeCCM(t *testing.T, ctx context.Context, what string, cond func(*v1.NativeCCM) bool) *v1.NativeCCM {
	t.Helper()
	var n *v1.NativeCCM
	waitFor(t, ctx, "NativeCCM "+nativeCCM+" "+what, func() (bool, string) {
		n = chartstest.NativeCCM(t, ctx, f.Config, nativeCCM)
		return cond(n), fmt.Sprintf("%+v", n.Status)
	})
	return n
}

// eventOf reports whether the NativeCCM has an event with reason.
func eventOf(t *testing.T, ctx context.Context, reason string) bool {
	t.Helper()
	ok := false
	_ = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := f.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + nativeCCM + ",reason=" + reason})
		ok = err == nil && len(list.Items) > 0
		return ok, nil
	})
	return ok
}

// waitFor polls cond for up to 5 minutes and fails the test with its last
// state.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() (bool, string)) {
	t.Helper()
	var state string
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		var ok bool
		ok, state = cond()
		return ok, nil
	}); err != nil {
		t.Fatalf("no %s: %s", what, state)
	}
}

func readValues(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]any{}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func ptrInt(i *int32) int32 {
	if i == nil {
		return 0
	}
	return *i
}
