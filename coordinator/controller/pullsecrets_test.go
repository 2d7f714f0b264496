package controller

import (
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
)

// coordinatorPullSecret is the coordinator's --image-pull-secrets in the
// suite: every release of the suite's reconciler gets it.
const coordinatorPullSecret = "product-registry"

// dockerConfigSecret is an image pull Secret as `kubectl create secret
// docker-registry` makes it, in the release namespace.
func dockerConfigSecret(name string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: releaseNamespace},
		Type:       corev1.SecretTypeDockerConfigJson,
		StringData: map[string]string{corev1.DockerConfigJsonKey: `{"auths":{"registry.example":{"auth":"dXNlcjpwYXNz"}}}`},
	}
}

// TestWaitsForImagePullSecrets: a NativeCCM naming an image pull Secret that
// is missing, or not of a type the kubelet reads, is not installed
// (Ready=False ImagePullSecretNotFound, a Warning event, the Secret named);
// once it is there, the CCM's pod — and so the ccm-gate sidecar in it —
// pulls with the coordinator's Secret and its own, each once. Names that are
// no Secret names, or repeats, never get past the API server.
func TestWaitsForImagePullSecrets(t *testing.T) {
	hcloudSecret(t)
	createNode(t, "pull-a-1", "pull-a", "hcloud://4001")
	createNativeCCM(t, &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: "pull-a"},
		Spec: v1.NativeCCMSpec{
			Platform:    "pull-a",
			Credentials: &v1.Credentials{SecretRef: meta.LocalObjectReference{Name: "hcloud"}},
			// the coordinator's again: one entry in the pod
			ImagePullSecrets: []v1.SecretReference{{Name: "mirror-pull-a"}, {Name: coordinatorPullSecret}},
		},
	})
	obj := waitCondition(t, "pull-a", meta.ReadyCondition, metav1.ConditionFalse, v1.ImagePullSecretNotFoundReason)
	if m := conditions.GetMessage(obj, meta.ReadyCondition); !strings.Contains(m, "Secret "+releaseNamespace+"/mirror-pull-a is missing") || obj.Status.Release != nil {
		t.Fatalf("Ready message %q, release %+v", m, obj.Status.Release)
	}
	if ok, state := hasEvent(t, "pull-a", v1.ImagePullSecretNotFoundReason); !ok {
		t.Error(state)
	}

	// A Secret of that name the kubelet would not read: still waiting.
	createSecret(t, "mirror-pull-a", map[string]string{"token": "x"})
	eventually(t, "the Secret's type named", func() (bool, string) {
		m := conditions.GetMessage(getNativeCCM(t, "pull-a"), meta.ReadyCondition)
		return strings.Contains(m, `mirror-pull-a is of type "Opaque", not kubernetes.io/dockerconfigjson`), m
	})
	if _, err := getDeployment(t, "native-ccm-pull-a"); err == nil {
		t.Fatal("installed while an image pull Secret is of the wrong type")
	}

	// The type of a Secret cannot change: replaced, as a user does.
	if err := k8s.Delete(ctxT(t), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "mirror-pull-a", Namespace: releaseNamespace}}); err != nil {
		t.Fatal(err)
	}
	create(t, dockerConfigSecret("mirror-pull-a"))
	waitCondition(t, "pull-a", meta.ReadyCondition, metav1.ConditionTrue, v1.InstallSucceededReason)
	d, err := getDeployment(t, "native-ccm-pull-a")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range d.Spec.Template.Spec.ImagePullSecrets {
		got = append(got, r.Name)
	}
	if want := []string{coordinatorPullSecret, "mirror-pull-a"}; !slices.Equal(got, want) {
		t.Errorf("pod imagePullSecrets %v, want %v", got, want)
	}
	// The gate is in that pod (a native sidecar: an init container).
	var images []string
	for _, c := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
		images = append(images, c.Image)
	}
	if !slices.Contains(images, gateImage) {
		t.Errorf("no ccm-gate in the pod that has the image pull Secrets: images %v", images)
	}

	// The API server refuses what is no Secret name, and a name twice.
	for _, bad := range [][]v1.SecretReference{
		{{Name: "Mirror"}},
		{{Name: "a/b"}},
		{{Name: ""}},
		{{Name: "same"}, {Name: "same"}},
	} {
		o := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: "pull-bad"}, Spec: v1.NativeCCMSpec{Platform: "pull-a", ImagePullSecrets: bad}}
		if err := k8s.Create(ctxT(t), o); err == nil {
			_ = k8s.Delete(ctxT(t), o)
			t.Errorf("NativeCCM with imagePullSecrets %v accepted", bad)
		} else if !strings.Contains(err.Error(), "imagePullSecrets") {
			t.Errorf("imagePullSecrets %v refused without naming the field: %v", bad, err)
		}
	}
}
