package fleet

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/test/cluster"
	"github.com/hybrid-ccm/hybrid-ccm/test/registry"
)

// Cluster DNS as Talos deploys it at bootstrap (cluster.coreDNS, on by
// default): CoreDNS in kube-system behind the Service kube-dns at the
// address every kubelet names (cluster.DNSServiceIP). The objects are
// Talos' (its bootstrap manifests), written here as Go objects; the image is
// CoreDNS as hack/coredns.sh builds it, under the name Talos pulls.
const (
	// DNSNamespace is where cluster DNS runs; DNSService its Service and
	// CoreDNS its Deployment, ConfigMap and ServiceAccount.
	DNSNamespace = "kube-system"
	DNSService   = "kube-dns"
	CoreDNS      = "coredns"
	// coreDNSRepository is the image Talos runs (tag: the version).
	coreDNSRepository = "registry.k8s.io/coredns/coredns"
	// DNSPodSelector selects CoreDNS's pods (the kube-dns Service's).
	DNSPodSelector = "k8s-app=" + dnsAppLabel
	dnsAppLabel    = "kube-dns"
)

// BuildCoreDNS builds (or finds in its cache) CoreDNS with hack/coredns.sh
// of the repository at root and returns the binary's path. A cold build
// needs the Go module proxy: `make coredns` (a prerequisite of make test and
// make demo) builds it before a test's network namespace hides the proxy.
func BuildCoreDNS(ctx context.Context, root string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "coredns.sh"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("fleet: hack/coredns.sh (make coredns builds it): %w\n%s", err, stderr.String())
	}
	bin := strings.TrimSpace(string(out))
	if bin == "" {
		return "", fmt.Errorf("fleet: hack/coredns.sh printed no binary path\n%s", stderr.String())
	}
	return bin, nil
}

// coreDNSVersion is what the binary says it is ("CoreDNS-1.15.0" → v1.15.0).
func coreDNSVersion(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "-version").Output()
	if err != nil {
		return "", fmt.Errorf("fleet: %s -version: %w", bin, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	v, ok := strings.CutPrefix(strings.TrimSpace(first), "CoreDNS-")
	if !ok || v == "" {
		return "", fmt.Errorf("fleet: %s -version said %q, not CoreDNS-<version>", bin, out)
	}
	return "v" + v, nil
}

// pushCoreDNS pushes CoreDNS's image under the name Talos pulls it by.
func (f *Fleet) pushCoreDNS(ctx context.Context, bin string) error {
	version, err := coreDNSVersion(ctx, bin)
	if err != nil {
		return err
	}
	image := coreDNSRepository + ":" + version
	// As upstream's image: non-root, the binary allowed to bind port 53.
	if _, err := f.Registry.PushBinary(ctx, image, bin, registry.ImageOptions{Path: "/coredns",
		Capabilities: []string{"CAP_NET_BIND_SERVICE"}}); err != nil {
		return fmt.Errorf("fleet: CoreDNS image: %w", err)
	}
	f.coreDNSImage = image
	return nil
}

// DeployClusterDNS creates what Talos creates for cluster DNS at bootstrap,
// running the image Up pushed: Up calls it, unless Options.DeferClusterDNS
// leaves it to the caller. It does not wait for CoreDNS: its pods need a
// node with a pod network (a pod CIDR), which may be talos-ccm's to give.
func (f *Fleet) DeployClusterDNS(ctx context.Context) error {
	if f.coreDNSImage == "" {
		return errors.New("fleet: no cluster DNS in this fleet (Options.NoClusterDNS)")
	}
	image := f.coreDNSImage
	cs := f.Client
	steps := []struct {
		what   string
		create func() error
	}{
		{"ServiceAccount", func() error {
			_, err := cs.CoreV1().ServiceAccounts(DNSNamespace).Create(ctx, &corev1.ServiceAccount{
				ObjectMeta: metav1.ObjectMeta{Name: CoreDNS, Namespace: DNSNamespace}}, metav1.CreateOptions{})
			return err
		}},
		{"ClusterRole", func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, coreDNSClusterRole(), metav1.CreateOptions{})
			return err
		}},
		{"ClusterRoleBinding", func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, coreDNSClusterRoleBinding(), metav1.CreateOptions{})
			return err
		}},
		{"ConfigMap", func() error {
			_, err := cs.CoreV1().ConfigMaps(DNSNamespace).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: CoreDNS, Namespace: DNSNamespace},
				Data:       map[string]string{"Corefile": corefile(cluster.ClusterDomain)}}, metav1.CreateOptions{})
			return err
		}},
		{"Deployment", func() error {
			_, err := cs.AppsV1().Deployments(DNSNamespace).Create(ctx, coreDNSDeployment(image), metav1.CreateOptions{})
			return err
		}},
		{"Service", func() error {
			_, err := cs.CoreV1().Services(DNSNamespace).Create(ctx, kubeDNSService(), metav1.CreateOptions{})
			return err
		}},
	}
	for _, s := range steps {
		if err := s.create(); err != nil {
			return fmt.Errorf("fleet: cluster DNS: %s: %w", s.what, err)
		}
	}
	f.logf("cluster DNS: CoreDNS %s (Deployment %s/%s), Service %s/%s at %s, domain %s", image, DNSNamespace, CoreDNS,
		DNSNamespace, DNSService, cluster.DNSServiceIP, cluster.ClusterDomain)
	return nil
}

// ClusterDNSEndpoints are the addresses of the ready endpoints of the
// Service kube-dns (its EndpointSlices): none while CoreDNS is not ready,
// or not deployed (Options.NoClusterDNS).
func (f *Fleet) ClusterDNSEndpoints(ctx context.Context) ([]string, error) {
	list, err := f.Client.DiscoveryV1().EndpointSlices(DNSNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + DNSService})
	if err != nil {
		return nil, fmt.Errorf("fleet: EndpointSlices of %s/%s: %w", DNSNamespace, DNSService, err)
	}
	return ReadyAddresses(list.Items), nil
}

// ReadyAddresses are the addresses of the ready endpoints of slices.
func ReadyAddresses(slices []discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range slices {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				out = append(out, e.Addresses...)
			}
		}
	}
	return out
}

// corefile is Talos' Corefile for domain without its forward block: Talos
// forwards every other name to the node's resolvers (forward .
// /etc/resolv.conf); nothing the test cluster runs may reach beyond this
// machine, and hack/coredns builds CoreDNS without the plugin, so this
// CoreDNS answers the cluster's names and refuses the rest.
func corefile(domain string) string {
	return fmt.Sprintf(`.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    log . {
        class error
    }
    prometheus :9153

    kubernetes %[1]s in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30 {
        disable success %[1]s
        disable denial %[1]s
    }
    loop
    reload
    loadbalance
}
`, domain)
}

func coreDNSClusterRole() *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns", Labels: map[string]string{"kubernetes.io/bootstrapping": "rbac-defaults"}},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{discoveryv1.GroupName}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
}

func coreDNSClusterRoleBinding() *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns",
			Labels:      map[string]string{"kubernetes.io/bootstrapping": "rbac-defaults"},
			Annotations: map[string]string{"rbac.authorization.kubernetes.io/autoupdate": "true"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:coredns"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: CoreDNS, Namespace: DNSNamespace}},
	}
}

// coreDNSDeployment is Talos' CoreDNS Deployment running image: two
// replicas, preferably on two nodes, that tolerate the control planes' and
// the uninitialized taint (cluster DNS must not wait for a CCM), with the
// node's resolv.conf (dnsPolicy Default: it is cluster DNS itself).
func coreDNSDeployment(image string) *appsv1.Deployment {
	labels := map[string]string{"k8s-app": dnsAppLabel}
	probe := func(path string, port int) corev1.ProbeHandler {
		return corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(port), Scheme: corev1.URISchemeHTTP}}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: CoreDNS, Namespace: DNSNamespace,
			Labels: map[string]string{"k8s-app": dnsAppLabel, "kubernetes.io/name": "CoreDNS"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(intstr.FromInt(1))}},
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{corev1.LabelOSStable: "linux"},
					Affinity: &corev1.Affinity{
						NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
							NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
								{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}},
								{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64", "arm64"}},
							}}},
						}},
						PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
							Weight: 100,
							PodAffinityTerm: corev1.PodAffinityTerm{
								LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
									{Key: "k8s-app", Operator: metav1.LabelSelectorOpIn, Values: []string{dnsAppLabel}}}},
								TopologyKey: corev1.LabelHostname,
							},
						}}},
					},
					ServiceAccountName: CoreDNS,
					PriorityClassName:  "system-cluster-critical",
					Tolerations: []corev1.Toleration{
						{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
						{Key: names.UninitializedTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
					},
					Containers: []corev1.Container{{
						Name:            CoreDNS,
						Image:           image,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Resources: corev1.ResourceRequirements{
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("170Mi")},
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("70Mi")},
						},
						Env:          []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "161MiB"}},
						Args:         []string{"-conf", "/etc/coredns/Corefile"},
						VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}},
						Ports: []corev1.ContainerPort{
							{Name: "dns", Protocol: corev1.ProtocolUDP, ContainerPort: 53},
							{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, ContainerPort: 53},
							{Name: "metrics", Protocol: corev1.ProtocolTCP, ContainerPort: 9153},
						},
						LivenessProbe: &corev1.Probe{ProbeHandler: probe("/health", 8080),
							InitialDelaySeconds: 60, TimeoutSeconds: 5, SuccessThreshold: 1, FailureThreshold: 5},
						ReadinessProbe: &corev1.Probe{ProbeHandler: probe("/ready", 8181)},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"},
								Drop: []corev1.Capability{"ALL"}},
							ReadOnlyRootFilesystem: ptr.To(true),
						},
					}},
					DNSPolicy: corev1.DNSDefault,
					Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: CoreDNS},
						Items:                []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}},
					}}}},
				},
			},
		},
	}
}

// kubeDNSService is the Service kube-dns at cluster.DNSServiceIP.
func kubeDNSService() *corev1.Service {
	ip := cluster.DNSServiceIP.String()
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: DNSService, Namespace: DNSNamespace,
			Annotations: map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "9153"},
			Labels:      map[string]string{"k8s-app": dnsAppLabel, "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"}},
		Spec: corev1.ServiceSpec{
			Selector:       map[string]string{"k8s-app": dnsAppLabel},
			ClusterIP:      ip,
			ClusterIPs:     []string{ip},
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol},
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicySingleStack),
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt(53)},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(53)},
				{Name: "metrics", Port: 9153, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(9153)},
			},
		},
	}
}
