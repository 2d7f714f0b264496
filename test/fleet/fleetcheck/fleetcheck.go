// Package fleetcheck holds what the tests that operate the product on a
// fleet (test/upgrade, test/adopt) assert alike: nodes initialized and Ready,
// serving certificates issued, Deployments rolled out to a release, cluster
// DNS ready and answering a pod (a probe pod runs commands for that), and a
// watch of what must never happen meanwhile.
package fleetcheck

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
)

// WaitRolledOut waits until the Deployment has rolled out its current
// template (every replica updated and available, no old pod left) and every
// container of the product in it runs an image of version.
func WaitRolledOut(t *testing.T, ctx context.Context, f *fleet.Fleet, ns, name, version string) {
	t.Helper()
	var last *appsv1.Deployment
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := f.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = d
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		s := d.Status
		return ProductImagesAt(f, d.Spec.Template.Spec, version) && s.ObservedGeneration == d.Generation &&
			s.UpdatedReplicas == want && s.AvailableReplicas == want && s.Replicas == want, nil
	}); err != nil {
		t.Fatalf("Deployment %s/%s not rolled out to %s: images %v status %+v", ns, name, version, Images(last), statusOfDeployment(last))
	}
}

// ProductImagesAt: every image of the release's registry in spec is at
// version (the upstream CCM images keep theirs).
func ProductImagesAt(f *fleet.Fleet, spec corev1.PodSpec, version string) bool {
	n := 0
	for _, img := range Images(&appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: spec}}}) {
		if isProductImage(f, img) {
			if !strings.HasSuffix(img, ":"+version) {
				return false
			}
			n++
		}
	}
	return n > 0
}

// isProductImage: img is one of the release's images (ship.Images), under
// the registry's release repository, under the published names, or where a
// release as the published names put it on the registry (fleet.ReleaseAs).
func isProductImage(f *fleet.Fleet, img string) bool {
	repo, _, _ := strings.Cut(img, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	dir, name := path.Split(repo)
	if !slices.Contains(ship.Images, name) {
		return false
	}
	dir = strings.TrimSuffix(dir, "/")
	mirror, err := f.MirrorOf(ship.DefaultRegistry)
	return dir == f.Registry.ReleaseRegistry() || dir == ship.DefaultRegistry || (err == nil && dir == mirror)
}

func Images(d *appsv1.Deployment) []string {
	if d == nil {
		return nil
	}
	var out []string
	for _, c := range append(slices.Clone(d.Spec.Template.Spec.InitContainers), d.Spec.Template.Spec.Containers...) {
		out = append(out, c.Image)
	}
	return out
}

func statusOfDeployment(d *appsv1.Deployment) appsv1.DeploymentStatus {
	if d == nil {
		return appsv1.DeploymentStatus{}
	}
	return d.Status
}

func Initialized(n *corev1.Node) bool {
	return n.Labels[names.PlatformLabel] != "" &&
		!slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == cloudproviderapi.TaintExternalCloudProvider })
}

func Ready(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
		return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
	})
}

func WaitNode(t *testing.T, ctx context.Context, f *fleet.Fleet, m fleet.Machine, what string, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	var last *corev1.Node
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := f.Client.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return cond(n), nil
	}); err != nil {
		if last == nil {
			t.Fatalf("node %s: not %s: never registered", m.Name, what)
		}
		t.Fatalf("node %s: not %s: labels %v taints %v conditions %+v", m.Name, what, last.Labels, last.Spec.Taints, last.Status.Conditions)
	}
	return last
}

// waitServingCSR waits for a kubelet-serving CSR of the node approved and
// issued.
func WaitServingCSR(t *testing.T, ctx context.Context, f *fleet.Fleet, node string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := f.Client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		return slices.ContainsFunc(list.Items, func(c certificatesv1.CertificateSigningRequest) bool {
			return c.Spec.SignerName == certificatesv1.KubeletServingSignerName && c.Spec.Username == "system:node:"+node && len(c.Status.Certificate) > 0
		}), nil
	}); err != nil {
		t.Fatalf("node %s: no serving certificate issued", node)
	}
}

// Watch records what must never happen while the product is installed,
// upgraded or handed over: a Node deleted or un-initialized, a CSR denied, a
// Lease taken over from a live holder, a native CCM with two Leases.
type Watch struct {
	nativeCCMs []string
	stopCh     chan struct{}
	mu         sync.Mutex
	errs       []string
	seen       map[string][]string // lease → holders in order
	leases     map[string]map[string]bool
}

// StartWatch watches Nodes, CSRs and Leases until stop.
func StartWatch(t *testing.T, ctx context.Context, f *fleet.Fleet, nativeCCMs []string) *Watch {
	t.Helper()
	w := &Watch{nativeCCMs: nativeCCMs, stopCh: make(chan struct{}), seen: map[string][]string{}, leases: map[string]map[string]bool{}}
	factory := informers.NewSharedInformerFactory(f.Client, 0)
	nodes := factory.Core().V1().Nodes().Informer()
	_, _ = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(o, n any) { w.node(o.(*corev1.Node), n.(*corev1.Node)) },
		DeleteFunc: func(o any) { w.fail("node %s deleted", nameOf(o)) },
	})
	csrs := factory.Certificates().V1().CertificateSigningRequests().Informer()
	_, _ = csrs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.csr(o.(*certificatesv1.CertificateSigningRequest)) },
		UpdateFunc: func(_, n any) { w.csr(n.(*certificatesv1.CertificateSigningRequest)) },
	})
	leases := factory.Coordination().V1().Leases().Informer()
	_, _ = leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.lease(nil, o.(*coordinationv1.Lease)) },
		UpdateFunc: func(o, n any) { w.lease(o.(*coordinationv1.Lease), n.(*coordinationv1.Lease)) },
	})
	factory.Start(w.stopCh)
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("watch: %v not synced", typ)
		}
	}
	return w
}

func (w *Watch) Stop() { close(w.stopCh) }

func (w *Watch) fail(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

func (w *Watch) Errors() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := slices.Clone(w.errs)
	// One Lease per native CCM: a second would be a second leader.
	for _, name := range w.nativeCCMs {
		if n := len(w.leases[name]); n > 1 {
			out = append(out, fmt.Sprintf("native CCM %s held %d leases: %v", name, n, w.leases[name]))
		}
	}
	return out
}

func (w *Watch) Holders() map[string][]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// node: an initialized node stays initialized, on its platform, with its
// providerID.
func (w *Watch) node(o, n *corev1.Node) {
	if !Initialized(o) {
		return
	}
	switch {
	case !Initialized(n):
		w.fail("node %s: initialized, then not: labels %v taints %v", n.Name, n.Labels, n.Spec.Taints)
	case n.Labels[names.PlatformLabel] != o.Labels[names.PlatformLabel]:
		w.fail("node %s: platform %q became %q", n.Name, o.Labels[names.PlatformLabel], n.Labels[names.PlatformLabel])
	case n.Spec.ProviderID != o.Spec.ProviderID:
		w.fail("node %s: providerID %q became %q", n.Name, o.Spec.ProviderID, n.Spec.ProviderID)
	}
}

// csr: every CSR here is an honest kubelet's; none is denied or fails.
func (w *Watch) csr(c *certificatesv1.CertificateSigningRequest) {
	for _, cond := range c.Status.Conditions {
		if cond.Type == certificatesv1.CertificateDenied || cond.Type == certificatesv1.CertificateFailed {
			w.fail("CSR %s of %s: %s %s: %s", c.Name, c.Spec.Username, cond.Type, cond.Reason, cond.Message)
		}
	}
}

// lease: a holder takes a Lease over only from no holder (released) or
// from a holder whose lease expired (renewTime + leaseDurationSeconds) — as
// client-go's leader election does; a takeover while the old holder's lease
// ran means two processes led at once.
func (w *Watch) lease(o, n *coordinationv1.Lease) {
	key := n.Namespace + "/" + n.Name
	holder := ptrString(n.Spec.HolderIdentity)
	w.mu.Lock()
	if h := w.seen[key]; holder != "" && (len(h) == 0 || h[len(h)-1] != holder) {
		w.seen[key] = append(h, holder)
	}
	if pod, _, _ := strings.Cut(holder, "_"); strings.HasPrefix(pod, "native-ccm-") {
		for _, name := range w.nativeCCMs {
			if strings.HasPrefix(pod, "native-ccm-"+name+"-") {
				if w.leases[name] == nil {
					w.leases[name] = map[string]bool{}
				}
				w.leases[name][key] = true
			}
		}
	}
	w.mu.Unlock()
	if o == nil {
		return
	}
	old := ptrString(o.Spec.HolderIdentity)
	if old == "" || holder == "" || old == holder || o.Spec.RenewTime == nil || o.Spec.LeaseDurationSeconds == nil {
		return
	}
	expires := o.Spec.RenewTime.Add(time.Duration(*o.Spec.LeaseDurationSeconds) * time.Second)
	if acquired := n.Spec.AcquireTime; acquired == nil || acquired.Before(&metav1.MicroTime{Time: expires}) {
		w.fail("lease %s: %s took it over at %v from %s, whose lease ran until %v", key, holder, n.Spec.AcquireTime, old, expires)
	}
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func nameOf(o any) string {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Key
	}
	if m, ok := o.(metav1.Object); ok {
		return m.GetName()
	}
	return fmt.Sprint(o)
}

// CredentialsSecrets creates the clouds' credentials Secrets in the
// coordinator's namespace ns under the names the tests' values give them
// (docs/profiles.md names the keys): hcloud's token, the AWS CCM's keys and
// cloud.conf pointing it at the fake EC2, and with gcp, GCP's.
func CredentialsSecrets(ctx context.Context, f *fleet.Fleet, clouds *fleet.Clouds, ns string, gcp bool) error {
	secrets := map[string]map[string]string{
		"hcloud":  {"token": "test-token"},
		"aws-ccm": awsCredentials(clouds.AWSCloudConf()),
	}
	if gcp {
		secrets["gcp-ccm"] = map[string]string{"credentials.json": "{}", "gce.conf": "[global]\nproject-id = prod\n"}
	}
	return createSecrets(ctx, f, ns, secrets)
}

// AWSRegionSecrets creates, for each region of the clouds' aws machines, the
// credentials Secret of one AWS CCM of that region in namespace ns:
// aws-ccm-<region>, its cloud.conf the region's (fleet's AWSRegionCloudConf:
// [Global] Region, every endpoint that region's). It returns the Secrets'
// names by region.
func AWSRegionSecrets(ctx context.Context, f *fleet.Fleet, clouds *fleet.Clouds, ns string) (map[string]string, error) {
	secrets, names := map[string]map[string]string{}, map[string]string{}
	for _, r := range clouds.AWSRegions() {
		conf, err := clouds.AWSRegionCloudConf(r)
		if err != nil {
			return nil, err
		}
		names[r] = "aws-ccm-" + r
		secrets[names[r]] = awsCredentials(conf)
	}
	return names, createSecrets(ctx, f, ns, secrets)
}

// awsCredentials are the keys of an aws credentials Secret (docs/profiles.md).
func awsCredentials(cloudConf string) map[string]string {
	return map[string]string{"access-key-id": "AKIAFAKEHYBRIDCCM", "secret-access-key": "fake-secret", "cloud.conf": cloudConf}
}

func createSecrets(ctx context.Context, f *fleet.Fleet, ns string, secrets map[string]map[string]string) error {
	for name, data := range secrets {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, StringData: data}
		if _, err := f.Client.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("secret %s/%s: %w", ns, name, err)
		}
	}
	return nil
}

// Join adds the machines to the fleet one after the other, in the
// background; the channel gets the first error, or nil once all joined.
func Join(ctx context.Context, f *fleet.Fleet, machines []fleet.Machine) <-chan error {
	joined := make(chan error, 1)
	go func() {
		for _, m := range machines {
			if err := f.AddMachine(ctx, m); err != nil {
				joined <- fmt.Errorf("machine %s: %w", m.Name, err)
				return
			}
		}
		joined <- nil
	}()
	return joined
}
