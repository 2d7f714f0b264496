package demo

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/csr/csrtest"
	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/test/cluster"
	"github.com/hybrid-ccm/hybrid-ccm/test/fleet"
)

// The static manifests the demo installs the product with, as Talos does
// (cluster.externalCloudProvider.manifests, in this order): docs/deploy, the
// charts rendered with their default values.
const (
	talosCCMManifest    = "docs/deploy/talos-ccm.yaml"
	coordinatorManifest = "docs/deploy/ccm-coordinator.yaml"
)

// talosCCMName is talos-ccm's Deployment, ConfigMap and talos.dev
// ServiceAccount prefix in the manifest (namespace kube-system).
const (
	talosCCMName      = "talos-ccm"
	talosCCMNamespace = "kube-system"
	// talosCCMTalosSA is the talos.dev ServiceAccount Talos answers with the
	// Secret talos-ccm mounts.
	talosCCMTalosSA = "talos-ccm-talos"
)

// readManifest reads a manifest of the repository.
func readManifest(root, file string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return nil, err
	}
	objs, err := fleet.DecodeManifests(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return objs, nil
}

// editTalosCCM makes the demo's own copy of docs/deploy/talos-ccm.yaml (a
// user may list "a URL of each file at the release you run, or your own
// copy", docs/install.md): the demo's transformation rules in the
// ConfigMap, and node IPAM on as docs/ipam.md says, because on this cluster,
// as on Talos with allocate-node-cidrs "false", kube-controller-manager
// allocates no pod CIDRs: talos-ccm gives every node its pod CIDR, from
// which the node's pod network is built (talos-ccm itself runs on the host
// network before any exists).
func editTalosCCM(objs []*unstructured.Unstructured) error {
	var rules, args, rbac bool
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() == talosCCMName {
			// node-ipam-controller patches spec.podCIDR(s): the default render,
			// without it, grants no patch on nodes (docs/ipam.md, RBAC)
			var err error
			if rbac, err = grantNodePatch(o); err != nil {
				return fmt.Errorf("%s: ClusterRole %s: %w", talosCCMManifest, talosCCMName, err)
			}
			continue
		}
		if o.GetName() != talosCCMName || o.GetNamespace() != talosCCMNamespace {
			continue
		}
		switch o.GetKind() {
		case "ConfigMap":
			if err := unstructured.SetNestedField(o.Object, Rules, "data", "transformations.yaml"); err != nil {
				return err
			}
			rules = true
		case "Deployment":
			containers, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			if err != nil || len(containers) != 1 {
				return fmt.Errorf("%s: Deployment %s: want one container (%v)", talosCCMManifest, talosCCMName, err)
			}
			c := containers[0].(map[string]any)
			var out []any
			for _, a := range c["args"].([]any) {
				s, _ := a.(string)
				if v, ok := strings.CutPrefix(s, "--controllers="); ok {
					s = "--controllers=" + v + ",node-ipam-controller"
				}
				out = append(out, s)
			}
			out = append(out, "--allocate-node-cidrs", "--cluster-cidr="+cluster.ClusterCIDR, "--service-cluster-ip-range="+cluster.ServiceCIDR)
			c["args"] = out
			if err := unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers"); err != nil {
				return err
			}
			args = true
		}
	}
	if !rules || !args || !rbac {
		return fmt.Errorf("%s: no ConfigMap, Deployment %s/%s or ClusterRole %s with a nodes rule to configure", talosCCMManifest, talosCCMNamespace, talosCCMName, talosCCMName)
	}
	return nil
}

// grantNodePatch adds the verb patch to the ClusterRole's rule on nodes of
// the core group; false when it has no such rule.
func grantNodePatch(role *unstructured.Unstructured) (bool, error) {
	rules, _, err := unstructured.NestedSlice(role.Object, "rules")
	if err != nil {
		return false, err
	}
	found := false
	for _, r := range rules {
		rule, _ := r.(map[string]any)
		groups, _, _ := unstructured.NestedStringSlice(rule, "apiGroups")
		resources, _, _ := unstructured.NestedStringSlice(rule, "resources")
		if !slices.Contains(groups, "") || !slices.Equal(resources, []string{"nodes"}) {
			continue
		}
		verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
		if !slices.Contains(verbs, "patch") {
			verbs = append(verbs, "patch")
		}
		if err := unstructured.SetNestedStringSlice(rule, verbs, "verbs"); err != nil {
			return false, err
		}
		found = true
	}
	if !found {
		return false, nil
	}
	return true, unstructured.SetNestedSlice(role.Object, rules, "rules")
}

// manifestImages are the images the manifests' Deployments run and the
// ccm-gate image the coordinator is told to add (--gate-image).
func manifestImages(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			m, _ := c.(map[string]any)
			if img, ok := m["image"].(string); ok {
				out = append(out, img)
			}
			args, _ := m["args"].([]any)
			for _, a := range args {
				if s, ok := a.(string); ok {
					if img, ok := strings.CutPrefix(s, "--gate-image="); ok {
						out = append(out, img)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// releaseOf is the registry and version every image is named with
// (<registry>/<name>:<version>): what `make release` must push.
func releaseOf(images []string) (registry, version string, err error) {
	for _, img := range images {
		ref, err := name.NewTag(img, name.StrictValidation)
		if err != nil {
			return "", "", fmt.Errorf("image %s: %w", img, err)
		}
		repo := ref.Context().Name()
		reg := repo[:strings.LastIndex(repo, "/")]
		if registry == "" {
			registry, version = reg, ref.TagStr()
		}
		if reg != registry || ref.TagStr() != version {
			return "", "", fmt.Errorf("the manifests name images of more than one release: %v", images)
		}
	}
	if registry == "" {
		return "", "", fmt.Errorf("the manifests name no image")
	}
	return registry, version, nil
}

// demoClouds are the NativeCCMs of the demo (metal has none): one per
// cloud, aws one per region, each owning that region's nodes (its domain)
// with a cloud.conf of that region.
var demoClouds = []struct {
	name, platform string
	secret         string
	data           map[string]string
	// region: the aws region the NativeCCM owns (spec.domain.selector on
	// topology.kubernetes.io/region, its cloud.conf's [Global] Region)
	region string
	// lb: spec.loadBalancers
	lb *v1alpha1.LoadBalancers
}{
	// cloud.conf: added by createNativeCCMs (the fake EC2's region endpoint)
	{awsNative, "aws", "aws-ccm-" + awsRegion, map[string]string{"access-key-id": "AKIADEMO", "secret-access-key": "demo"}, awsRegion, &v1alpha1.LoadBalancers{Enabled: true}},
	{awsNative2, "aws", "aws-ccm-" + awsRegion2, map[string]string{"access-key-id": "AKIADEMO", "secret-access-key": "demo"}, awsRegion2, nil},
	{"gcp", "gcp", "gcp-ccm", map[string]string{"credentials.json": "{}", "gce.conf": "[global]\nproject-id=hybrid-demo\n"}, "",
		&v1alpha1.LoadBalancers{Enabled: true, Default: true}},
	{"hcloud", "hcloud", "hcloud", map[string]string{"token": "demo-token"}, "", &v1alpha1.LoadBalancers{Enabled: true}},
}

// The NativeCCMs of the two aws regions.
const (
	awsNative  = "aws-" + awsRegion
	awsNative2 = "aws-" + awsRegion2
)

// nativeNames are the names of demoClouds.
func nativeNames() []string {
	var out []string
	for _, d := range demoClouds {
		out = append(out, d.name)
	}
	return out
}

// nativeNamespace is the coordinator's own namespace (the manifest makes
// it): the native CCM releases, their credentials and pods.
const nativeNamespace = "hybrid-ccm-system"

// createNativeCCMs creates, as a user does with kubectl, per demo cloud its
// credentials Secret (dummy values: nothing leaves the machine) and a
// NativeCCM with install policy Auto: the upstream AWS CCM with a cloud.conf
// pointing at its region's endpoint of the fake EC2, test/testccm asking the
// fake clouds.
func createNativeCCMs(ctx context.Context, c client.Client, clouds *fleet.Clouds) error {
	for _, d := range demoClouds {
		data := maps.Clone(d.data)
		var env []corev1.EnvVar
		if d.platform == "aws" {
			conf, err := clouds.AWSRegionCloudConf(d.region)
			if err != nil {
				return err
			}
			data["cloud.conf"] = conf
		} else {
			env = []corev1.EnvVar{{Name: "TESTCCM_CLOUD_URL", Value: clouds.TestCCMURL()}}
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: d.secret, Namespace: nativeNamespace}, StringData: data}
		if err := c.Create(ctx, sec); err != nil {
			return fmt.Errorf("secret %s: %w", d.secret, err)
		}
		n := &v1alpha1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: d.name}, Spec: v1alpha1.NativeCCMSpec{
			Platform:      d.platform,
			LoadBalancers: d.lb,
		}}
		if d.region != "" {
			n.Spec.Credentials = &v1alpha1.Credentials{SecretRef: meta.LocalObjectReference{Name: d.secret}}
			n.Spec.Domain = &v1alpha1.Domain{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelTopologyRegion: d.region}}}
		}
		if len(env) > 0 {
			n.Spec.Overrides = &v1alpha1.Overrides{Env: env}
		}
		// what the fence confines its CCM to, created with the NativeCCM as
		// the hybrid-ccm chart does
		if err := gate.EnsureGrant(ctx, c, gate.GrantFor(n, nativeNamespace)); err != nil {
			return fmt.Errorf("nativeccm %s: %w", d.name, err)
		}
		if err := c.Create(ctx, n); err != nil {
			return fmt.Errorf("nativeccm %s: %w", d.name, err)
		}
	}
	return nil
}

// demoServices are the LoadBalancer Services the demo creates (namespace
// shopNamespace): one per cloud that serves load balancers, and one without a
// class for the default; cloud is the provider whose load balancer must serve
// it, platform (and region, if set) the nodes it may target: the domain of
// the NativeCCM that serves it.
var demoServices = []struct {
	name, class, cloud, platform, region string
}{
	{"web-aws", "hybridccm.io/aws", "aws", "aws", awsRegion},
	{"web-hcloud", "hybridccm.io/hcloud", "hcloud", "hcloud", ""},
	{"web-gcp", "hybridccm.io/gcp", "gce", "gcp", ""},
	{"web", "", "gce", "gcp", ""},
}

// shopNamespace holds the demo's Services.
const shopNamespace = "shop"

// createServices creates the demo's LoadBalancer Services.
func createServices(ctx context.Context, cs kubernetes.Interface) error {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: shopNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, d := range demoServices {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: d.name, Namespace: shopNamespace},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": d.name},
				Ports: []corev1.ServicePort{{Port: 80}}}}
		if d.class != "" {
			svc.Spec.LoadBalancerClass = &d.class
		}
		if _, err := cs.CoreV1().Services(shopNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("service %s: %w", d.name, err)
		}
	}
	return nil
}

// forgedCSR is the name of the kubelet-serving CSR the demo forges.
const forgedCSR = "forged-by-" + terminatedAWS

// submitForgedCSR files, with the real kubelet credential of node by, a
// kubelet-serving CSR for its own name but the address of node victim: an
// impostor asking for a certificate that would let it serve as the victim.
// talos-ccm must deny it (the address is not one it established for by).
func submitForgedCSR(ctx context.Context, f *fleet.Fleet, by, victim string) error {
	n, v := f.Node(by), f.Node(victim)
	if n == nil || v == nil {
		return fmt.Errorf("no node %s or %s", by, victim)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", n.Kubeconfig())
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	pemBytes, err := csrtest.Request{NodeName: by, DNSNames: []string{by}, IPs: csrtest.Addrs(v.IP.String())}.PEM()
	if err != nil {
		return err
	}
	_, err = cs.CertificatesV1().CertificateSigningRequests().Create(ctx, csrtest.Object(forgedCSR, pemBytes), metav1.CreateOptions{})
	return err
}

// waitNativeCCMKind waits until the NativeCCM kind is served (the manifest's CRD).
func waitNativeCCMKind(ctx context.Context, c client.Client) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var l v1alpha1.NativeCCMList
		return c.List(ctx, &l) == nil, nil
	})
}
