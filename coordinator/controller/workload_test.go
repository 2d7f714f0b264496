package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestParseCCMContainer(t *testing.T) {
	cases := []struct {
		name      string           // case
		c         corev1.Container // container
		ccm       bool             // recognised as a CCM
		cloudNode bool             // runs cloud-node
		talos     bool             // is talos-ccm
		lease     string           // lease name
	}{
		{name: "upstream default", c: corev1.Container{Image: "registry.k8s.io/provider-aws/cloud-controller-manager:v1", Args: []string{"--cloud-provider=aws"}},
			ccm: true, cloudNode: true, lease: "cloud-controller-manager"},
		{name: "lifecycle only, own lease", c: corev1.Container{Image: "x/hcloud", Args: []string{"--cloud-provider", "hcloud", "--controllers=cloud-node-lifecycle", "--leader-elect-resource-name=native-ccm-hcloud"}},
			ccm: true, lease: "native-ccm-hcloud"},
		{name: "talos-ccm runs cloud-node by design", c: corev1.Container{Image: "ghcr.io/x/talos-ccm:v1", Args: []string{"--cloud-provider=talos", "--leader-elect-resource-name=talos-ccm"}},
			ccm: true, cloudNode: true, talos: true, lease: "talos-ccm"},
		{name: "not a CCM", c: corev1.Container{Image: "nginx", Args: []string{"--port=80"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, ok := ParseCCMContainer("Deployment/ns/x", c.c)
			if ok != c.ccm {
				t.Fatalf("recognised = %v", ok)
			}
			if !ok {
				return
			}
			if w.RunsCloudNode() != c.cloudNode || w.IsTalosCCM() != c.talos || w.LeaseName != c.lease {
				t.Fatalf("got %+v (cloudNode %v, talos %v)", w, w.RunsCloudNode(), w.IsTalosCCM())
			}
		})
	}
}
