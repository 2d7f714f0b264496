package cli

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestImageTag(t *testing.T) {
	for ref, want := range map[string]string{
		"ghcr.io/hybrid-ccm/talos-ccm:0.2.0":                "0.2.0",
		"10.99.0.1:5000/hybrid-ccm/ccm-gate:0.1.1":          "0.1.1",
		"10.99.0.1:5000/hybrid-ccm/ccm-gate":                "",
		"ghcr.io/hybrid-ccm/ccm-gate:0.2.0@sha256:0123abcd": "0.2.0",
		"ghcr.io/hybrid-ccm/ccm-gate@sha256:0123abcd":       "",
		"localhost:5000/x":                                  "",
		"":                                                  "",
	} {
		if got := imageTag(ref); got != want {
			t.Errorf("imageTag(%q) = %q, want %q", ref, got, want)
		}
	}
}

// A native CCM release: the gate (a native sidecar) is the product's, the
// upstream CCM is not.
func TestComponentNativeCCM(t *testing.T) {
	d := appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "hybrid-ccm-system", Name: "native-ccm-aws", Labels: map[string]string{"app.kubernetes.io/name": "native-ccm"}},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "ccm-gate", Image: "ghcr.io/hybrid-ccm/ccm-gate:0.2.0"}},
			Containers:     []corev1.Container{{Name: "aws-cloud-controller-manager", Image: "registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.2"}},
		}}},
		Status: appsv1.DeploymentStatus{ReadyReplicas: 1},
	}
	c := component(d)
	if c.Component != "native-ccm" || !slices.Equal(c.Versions, []string{"0.2.0"}) || c.Ready != 1 || c.Replicas != 1 {
		t.Errorf("component = %+v", c)
	}
}
