package oncluster

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// TestPrivateRegistry: the release is in a registry that refuses to serve
// it without credentials — an anonymous request is answered 401, and a pod
// without the image pull Secret never gets the image while the same pod with
// it does — and the product, installed with global.imagePullSecrets, runs
// every one of its images from there: talos-ccm (kube-system), the
// coordinator, and each native CCM's ccm-gate sidecar, which the
// coordinator renders with the Secret of its --image-pull-secrets (the
// native CCMs' own images are upstream ones, which stay anonymous).
func TestPrivateRegistry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	install(t)

	// The registry really requires authentication for the release.
	manifest := "https://" + f.Registry.Host() + "/v2/hybrid-ccm/ccm-gate/manifests/" + version
	for _, tc := range []struct {
		// with the registry's credentials?
		auth bool
		// want is the status.
		want int
	}{{false, http.StatusUnauthorized}, {true, http.StatusOK}} {
		req, err := http.NewRequestWithContext(ctx, http.MethodHead, manifest, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", "application/vnd.oci.image.index.v1+json")
		if tc.auth {
			req.SetBasicAuth(releaseCredentials.Username, releaseCredentials.Password)
		}
		resp, err := f.Registry.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Fatalf("HEAD %s (credentials: %t): %s, want %d", manifest, tc.auth, resp.Status, tc.want)
		}
	}

	// Every pod of the product names the Secret and runs its release
	// images, pulled from the private registry.
	for _, name := range nativeCCMs {
		chartstest.WaitNativeCCMRunning(t, ctx, f.Config, name)
	}
	release := f.Registry.ReleaseRegistry() + "/"
	var ran map[string][]string // release image → pods that run it
	var problems []string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		ran, problems = map[string][]string{}, nil
		for _, p := range productPods(t, ctx) {
			if !slices.ContainsFunc(p.Spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == pullSecret }) {
				problems = append(problems, fmt.Sprintf("pod %s/%s has image pull Secrets %v, not %s", p.Namespace, p.Name, p.Spec.ImagePullSecrets, pullSecret))
			}
			statuses := append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...)
			for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
				img, ok := strings.CutPrefix(c.Image, release)
				if !ok {
					continue
				}
				i := slices.IndexFunc(statuses, func(cs corev1.ContainerStatus) bool { return cs.Name == c.Name })
				if i < 0 || statuses[i].ImageID == "" || (statuses[i].State.Running == nil && statuses[i].State.Terminated == nil) {
					problems = append(problems, fmt.Sprintf("pod %s/%s container %s: image %s not pulled and started (%+v)", p.Namespace, p.Name, c.Name, c.Image, statuses))
					continue
				}
				ran[img] = append(ran[img], p.Name)
			}
		}
		return len(problems) == 0, nil
	}); err != nil {
		t.Errorf("the product's pods and the private registry: %v", problems)
	}
	for _, img := range []string{"talos-ccm", "ccm-coordinator", "ccm-gate"} {
		pods := ran[img+":"+version]
		want := 1
		if img == "ccm-gate" {
			want = len(nativeCCMs) // one sidecar per native CCM
		}
		if len(pods) < want {
			t.Errorf("image %s%s:%s runs in pods %v, want at least %d", release, img, version, pods, want)
		}
		t.Logf("%s%s:%s pulled with Secret %s for %v", release, img, version, pullSecret, pods)
	}

	// The same pod, pulling a release image afresh on a node that has never
	// run one, without and with the Secret: only the second gets it.
	if err := f.CreatePullSecret(ctx, "default", pullSecret); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	image := ship.ImageRef(f.Registry.ReleaseRegistry(), "ccm-gate", version)
	without := pullPod(t, ctx, "pull-without-secret", image, nil)
	with := pullPod(t, ctx, "pull-with-secret", image, []corev1.LocalObjectReference{{Name: pullSecret}})
	var last string
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		refused, pulled := false, false
		last = ""
		for _, name := range []string{without, with} {
			p, err := f.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cs := range p.Status.ContainerStatuses {
				last += fmt.Sprintf("%s: image ID %q, state %+v; ", name, cs.ImageID, cs.State)
				w := cs.State.Waiting
				if name == without && w != nil && w.Reason == "ErrImagePull" {
					msg := strings.ToLower(w.Message)
					if strings.Contains(msg, "not found") || !(strings.Contains(msg, "401") || strings.Contains(msg, "authoriz")) {
						return false, fmt.Errorf("pod %s: the pull failed, but not for want of credentials: %s", name, w.Message)
					}
					refused = true
				}
				if name == with && cs.ImageID != "" {
					pulled = true
				}
			}
		}
		return refused && pulled, nil
	}); err != nil {
		t.Errorf("a pull without the Secret refused and one with it done: %v\n%s", err, last)
	}
	w, _ := f.Client.CoreV1().Pods("default").Get(ctx, without, metav1.GetOptions{})
	if w != nil && len(w.Status.ContainerStatuses) == 1 && w.Status.ContainerStatuses[0].ImageID != "" {
		t.Errorf("pod %s got image %s without the Secret", without, image)
	}
	t.Logf("without the Secret: %s", last)
}

// pullPod starts a pod that pulls image (always afresh) on metal-2, a node
// without any pod of the product, with the given image pull Secrets; it is
// deleted when the test ends. The container need not run well: the test
// looks at the pull.
func pullPod(t *testing.T, ctx context.Context, name, image string, secrets []corev1.LocalObjectReference) string {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                     "metal-2",
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			ImagePullSecrets:             secrets,
			Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			SecurityContext:              &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: "pull", Image: image, ImagePullPolicy: corev1.PullAlways,
				SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
	if _, err := f.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.Client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return name
}
