package gate

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// Where the sidecar and the CCM meet inside the pod.
const (
	// SidecarName is the ccm-gate container's name.
	SidecarName = "ccm-gate"
	// KubeconfigPath is the CCM's kubeconfig (from the release's ConfigMap).
	KubeconfigPath = "/etc/ccm-gate/kubeconfig"
	// TLSDir is the volume the gate shares with the CCM alone: the gate's
	// self-signed certificate and the client token (ClientTokenPath).
	TLSDir = "/var/run/ccm-gate"
	// ClientTokenPath is the per-pod bearer token the gate creates at start and
	// accepts from the CCM, and nothing else does: the CCM's kubeconfig names it.
	ClientTokenPath = TLSDir + "/token"
	// ServiceAccountDir is where the pod's ServiceAccount token (with ca.crt
	// and namespace) is projected: into the gate container only, which
	// authenticates with it (in-cluster configuration, re-read as the kubelet
	// rotates it). The pod does not automount it anywhere else.
	ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	// ServiceAccountTokenPath is the gate's ServiceAccount token file.
	ServiceAccountTokenPath = ServiceAccountDir + "/token"
	// KubeconfigAnnotation on the pod template is the digest of the kubeconfig,
	// so that pods restart when it changes.
	KubeconfigAnnotation = "hybridccm.io/gate-kubeconfig"

	kubeconfigVolume = "ccm-gate-kubeconfig"
	tlsVolume        = "ccm-gate-tls"
	// TokenVolume is the projected ServiceAccount token of the gate.
	TokenVolume = "ccm-gate-serviceaccount"
	// tokenExpirationSeconds is what the ServiceAccount admission plugin
	// requests for the automatic token; the kubelet refreshes it at 80%.
	tokenExpirationSeconds = 3607
	kubeconfigKey          = "kubeconfig"

	// Ports are derived from the CCM's unique --secure-port, so that CCMs on
	// the host network never clash.
	proxyPortOffset  = 10000
	healthPortOffset = 11000
	// metricsPortOffset (from the health port) places /metrics on loopback.
	metricsPortOffset = 1000
)

// Sidecar is the release mutator that puts ccm-gate in front of a native CCM:
// it adds the gate as a native sidecar (an init container with restartPolicy
// Always, so it is ready before the CCM starts), generates a kubeconfig that
// points the CCM at the gate on loopback with the gate's per-pod client token,
// and rewrites the CCM container's --kubeconfig and delegated-authentication
// kubeconfigs (dropping --master). The pod's ServiceAccount token is projected
// into the gate alone (automountServiceAccountToken: false): the CCM holds no
// credential the API server accepts, so the view is its only way in.
type Sidecar struct {
	// Release is the release name; the CCM's pod template carries it in the
	// label hybridccm.io/native-ccm (set by release.Lifecycle, which runs first).
	Release string `json:"release"`
	// Namespace of the release.
	Namespace string `json:"namespace"`
	// Platform the view shows.
	Platform string `json:"platform"`
	// DomainSelector narrows the view to the CCM's domain; empty: the platform.
	DomainSelector string `json:"domainSelector,omitempty"`
	// LoadBalancerClass is the spec.loadBalancerClass of the Services the CCM
	// serves (--load-balancer-class); empty: load balancers off, the CCM sees
	// no Service.
	LoadBalancerClass string `json:"loadBalancerClass,omitempty"`
	// DefaultLoadBalancerClass: the CCM also serves Services of type
	// LoadBalancer without a class (--default-load-balancer-class).
	DefaultLoadBalancerClass bool `json:"defaultLoadBalancerClass,omitempty"`
	// Image of ccm-gate.
	Image string `json:"image"`
	// ImagePullPolicy of the gate; empty: Kubernetes' default.
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Container is the CCM container's name; empty: the first container.
	Container string `json:"container,omitempty"`
	// ProxyPort is the gate's loopback port, HealthPort serves its probes on
	// the pod IP; /metrics is served on loopback at HealthPort+1000.
	ProxyPort  int32 `json:"proxyPort"`
	HealthPort int32 `json:"healthPort"`
	// PlainHTTP serves the CCM plain HTTP on loopback instead of HTTPS.
	PlainHTTP bool `json:"plainHTTP,omitempty"`
	// StartupAccess is what the release binds its ServiceAccount to
	// (release.Lifecycle.StartupAccess), in proxy.Access's flag form: the
	// gate's startup probe passes only once its identity, the CCM's, has been
	// allowed all of it, so the CCM container never starts before its RBAC is
	// in effect.
	StartupAccess []string `json:"startupAccess,omitempty"`
	// TokenAudiences are the audiences of ServiceAccount tokens the chart may
	// project into the pod (the profile's ccm.tokenAudiences); every other
	// token projection is refused.
	TokenAudiences []string `json:"tokenAudiences,omitempty"`
}

var _ release.Mutator = Sidecar{}

// SidecarFor derives the sidecar of a release from its lifecycle settings.
func SidecarFor(l release.Lifecycle, image string) Sidecar {
	s := Sidecar{
		Release:        l.Release,
		Namespace:      l.Namespace,
		Platform:       l.Platform,
		DomainSelector: l.DomainSelector,
		Image:          image,
		ProxyPort:      l.SecurePort + proxyPortOffset,
		HealthPort:     l.SecurePort + healthPortOffset,
	}
	if l.Workload != nil {
		s.Container = l.Workload.Container
	}
	s.TokenAudiences = append([]string(nil), l.TokenAudiences...)
	for _, a := range l.StartupAccess() {
		s.StartupAccess = append(s.StartupAccess, proxy.Access{
			Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource, Namespace: a.Namespace, Name: a.Name,
		}.String())
	}
	if lb := l.LoadBalancers; lb != nil {
		// the view shows it the Services of its class (and those without a
		// class while it is the default), as the fence lets it change them
		s.LoadBalancerClass, s.DefaultLoadBalancerClass = lb.Class, lb.Default
	}
	return s
}

// Name implements release.Mutator.
func (s Sidecar) Name() string { return "gate" }

// Fingerprint implements release.Mutator.
func (s Sidecar) Fingerprint() string {
	b, _ := json.Marshal(struct {
		V int
		S Sidecar
	}{V: 4, S: s})
	return fmt.Sprintf("%x", sha256.Sum256(b))[:16]
}

// MetricsPort is where the gate serves /metrics, on loopback only.
func (s Sidecar) MetricsPort() int32 { return s.HealthPort + metricsPortOffset }

// ConfigMapName holds the CCM's kubeconfig.
func (s Sidecar) ConfigMapName() string { return s.Release + "-gate" }

// ProxyURL is where the CCM finds its API server.
func (s Sidecar) ProxyURL() string {
	scheme := "https"
	if s.PlainHTTP {
		scheme = "http"
	}
	return scheme + "://127.0.0.1:" + strconv.Itoa(int(s.ProxyPort))
}

// Kubeconfig is the CCM's kubeconfig: the gate on loopback, the gate's client
// token (a per-pod secret the gate writes at start; no API server accepts it).
func (s Sidecar) Kubeconfig() ([]byte, error) {
	c := clientcmdapi.NewConfig()
	cluster := &clientcmdapi.Cluster{Server: s.ProxyURL()}
	if !s.PlainHTTP {
		cluster.CertificateAuthority = path.Join(TLSDir, proxy.CertFile)
	}
	c.Clusters[SidecarName] = cluster
	c.AuthInfos[s.Release] = &clientcmdapi.AuthInfo{TokenFile: ClientTokenPath}
	c.Contexts[SidecarName] = &clientcmdapi.Context{Cluster: SidecarName, AuthInfo: s.Release}
	c.CurrentContext = SidecarName
	return clientcmd.Write(*c)
}

func (s Sidecar) validate() error {
	if err := s.check(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

func (s Sidecar) check() error {
	switch {
	case s.Release == "" || s.Namespace == "":
		return fmt.Errorf("release and namespace are required")
	case s.Platform == "":
		return fmt.Errorf("platform is required: an empty platform would show every unlabelled node")
	case s.Image == "":
		return fmt.Errorf("ccm-gate image is required")
	case s.DomainSelector != "" && proxy.ValidateDomainSelector(s.DomainSelector) != nil:
		return proxy.ValidateDomainSelector(s.DomainSelector)
	case s.DefaultLoadBalancerClass && s.LoadBalancerClass == "":
		return fmt.Errorf("the default for Services without a class needs a load-balancer class of its own")
	case s.ProxyPort <= 0 || s.ProxyPort > 65535 || s.HealthPort <= 0 || s.MetricsPort() > 65535:
		return fmt.Errorf("ports %d/%d out of range (secure port too high?)", s.ProxyPort, s.HealthPort)
	}
	return nil
}

// Mutate implements release.Mutator.
func (s Sidecar) Mutate(m *release.Manifests) error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("gate sidecar of %s: %w", s.Release, err)
	}
	w, err := s.findWorkload(m)
	if err != nil {
		return err
	}
	raw, found, err := unstructured.NestedMap(w.Object, "spec", "template")
	if err != nil || !found {
		return fmt.Errorf("%s %s: no spec.template: %v", w.GetKind(), w.GetName(), err)
	}
	var tpl corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &tpl); err != nil {
		return fmt.Errorf("%s %s: decode pod template: %w", w.GetKind(), w.GetName(), err)
	}
	kubeconfig, err := s.Kubeconfig()
	if err != nil {
		return err
	}
	if err := tokenSecrets(m); err != nil {
		return err
	}
	if err := s.editPod(&tpl, kubeconfig); err != nil {
		return fmt.Errorf("%s %s: %w", w.GetKind(), w.GetName(), err)
	}
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&tpl)
	if err != nil {
		return err
	}
	unstructured.RemoveNestedField(out, "metadata", "creationTimestamp")
	if err := unstructured.SetNestedMap(w.Object, out, "spec", "template"); err != nil {
		return err
	}
	cm, err := s.configMap(kubeconfig)
	if err != nil {
		return err
	}
	m.Remove(func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "ConfigMap" && o.GetName() == cm.GetName() && o.GetNamespace() == cm.GetNamespace()
	})
	m.Add(cm)
	return nil
}

// findWorkload is the one Deployment or DaemonSet whose pod template the
// lifecycle mutator marked as this release's CCM.
func (s Sidecar) findWorkload(m *release.Manifests) (*unstructured.Unstructured, error) {
	var found []*unstructured.Unstructured
	for _, o := range m.Objects {
		if o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet" {
			continue
		}
		labels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		if labels[release.NativeCCMLabel] == s.Release {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("gate sidecar: want exactly one workload with pod label %s=%s (the lifecycle mutator runs first), found %d", release.NativeCCMLabel, s.Release, len(found))
	}
	return found[0], nil
}

func (s Sidecar) editPod(tpl *corev1.PodTemplateSpec, kubeconfig []byte) error {
	spec := &tpl.Spec
	if len(spec.Containers) == 0 {
		return fmt.Errorf("no containers")
	}
	idx := 0
	if s.Container != "" {
		if idx = slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == s.Container }); idx < 0 {
			return fmt.Errorf("no container %q", s.Container)
		}
	}
	ccm := &spec.Containers[idx]
	if ccm.Name == SidecarName {
		return fmt.Errorf("the CCM container is named %q, like the gate", SidecarName)
	}

	// The CCM talks only to the gate: its own kubeconfig and --master go, and
	// so do the delegated-authentication kubeconfigs of its secure port (without
	// them it would use the in-cluster configuration, and it has no token).
	if len(ccm.Command) > 1 {
		ccm.Command = append(ccm.Command[:1:1], stripFlags(ccm.Command[1:], apiServerFlags...)...)
	}
	// Its kubeconfig flags go first, right after the command (as the
	// lifecycle mutator's enforced flags do): no flag before them may take
	// one as its value.
	if err := release.CheckCommand(ccm.Command); err != nil {
		return fmt.Errorf("container %s: %w", ccm.Name, err)
	}
	rest := stripFlags(ccm.Args, apiServerFlags...)
	ccm.Args = make([]string, 0, len(kubeconfigFlags)+len(rest))
	for _, f := range kubeconfigFlags {
		ccm.Args = append(ccm.Args, f+"="+KubeconfigPath)
	}
	ccm.Args = append(ccm.Args, rest...)
	ccm.VolumeMounts = setMount(ccm.VolumeMounts,
		corev1.VolumeMount{Name: kubeconfigVolume, MountPath: path.Dir(KubeconfigPath), ReadOnly: true},
		corev1.VolumeMount{Name: tlsVolume, MountPath: TLSDir, ReadOnly: true},
	)

	spec.InitContainers = slices.DeleteFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == SidecarName })
	// No container but the gate holds a token the API server accepts: no
	// automatic one, and no projected one the chart asks for.
	spec.AutomountServiceAccountToken = ptr.To(false)
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == TokenVolume })
	if err := tokenStaysInGate(spec, s.TokenAudiences); err != nil {
		return err
	}
	spec.InitContainers = append([]corev1.Container{s.container()}, spec.InitContainers...)
	spec.Volumes = setVolume(spec.Volumes,
		corev1.Volume{Name: kubeconfigVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: s.ConfigMapName()},
		}}},
		corev1.Volume{Name: tlsVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("1Mi")),
		}}},
		tokenVolume(),
	)
	if tpl.Annotations == nil {
		tpl.Annotations = map[string]string{}
	}
	tpl.Annotations[KubeconfigAnnotation] = fmt.Sprintf("%x", sha256.Sum256(kubeconfig))[:16]
	return nil
}

// container is the ccm-gate native sidecar.
func (s Sidecar) container() corev1.Container {
	args := []string{
		"--listen=127.0.0.1:" + strconv.Itoa(int(s.ProxyPort)),
		// Probes come from the kubelet to the pod IP; they answer only "ok".
		"--health-listen=:" + strconv.Itoa(int(s.HealthPort)),
		// Metrics carry no secrets but are unauthenticated: loopback only.
		"--metrics-listen=127.0.0.1:" + strconv.Itoa(int(s.MetricsPort())),
		"--platform=" + s.Platform,
	}
	if s.DomainSelector != "" {
		// A selector domain.Domain wrote from validated keys and values.
		args = append(args, "--domain-selector="+s.DomainSelector)
	}
	args = append(args,
		// The gate authenticates with the ServiceAccount token projected into
		// it alone, and accepts from the CCM only the client token it writes.
		"--credentials="+string(proxy.OwnCredentials),
		"--client-token-file="+ClientTokenPath,
	)
	if s.LoadBalancerClass != "" {
		// Services of type LoadBalancer of this class, without the class.
		args = append(args, "--load-balancer-class="+s.LoadBalancerClass)
	}
	if s.DefaultLoadBalancerClass {
		args = append(args, "--default-load-balancer-class")
	}
	if !s.PlainHTTP {
		args = append(args, "--tls-dir="+TLSDir)
	}
	for _, a := range s.StartupAccess {
		args = append(args, "--startup-access="+a)
	}
	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("gate-health")}},
			PeriodSeconds:    period,
			FailureThreshold: failures,
		}
	}
	return corev1.Container{
		Name:            SidecarName,
		Image:           s.Image,
		ImagePullPolicy: s.ImagePullPolicy,
		Args:            args,
		// A native sidecar: started (and ready) before the CCM, stopped after it.
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Ports:         []corev1.ContainerPort{{Name: "gate-health", ContainerPort: s.HealthPort, Protocol: corev1.ProtocolTCP}},
		// The CCM starts only once the gate's node cache has synced and its
		// identity has been allowed StartupAccess (the kubelet starts the
		// containers after a native sidecar's startup probe has passed).
		StartupProbe:   probe("/readyz", 1, 300),
		ReadinessProbe: probe("/readyz", 10, 3),
		LivenessProbe:  probe("/livez", 20, 3),
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("24Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To[int64](65532),
			ReadOnlyRootFilesystem:   ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: tlsVolume, MountPath: TLSDir},
			{Name: TokenVolume, MountPath: ServiceAccountDir, ReadOnly: true},
		},
	}
}

// tokenVolume is the gate's projected ServiceAccount token: what the
// ServiceAccount admission plugin would automount, mounted in one container.
func tokenVolume() corev1.Volume {
	return corev1.Volume{Name: TokenVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o444),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](tokenExpirationSeconds)}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
			}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}},
			}}},
		},
	}}}
}

// tokenStaysInGate refuses a pod in which a container other than the gate
// could hold a token the API server may accept, or read the gate's:
//   - a serviceAccountToken projection for any audience the profile does not
//     declare in ccm.tokenAudiences (a cloud's workload identity); without an
//     audience the token is for the API server, and the API server's own
//     audience (its issuer) is as good: only the profile's operator knows
//     which audiences the cluster's API server accepts;
//   - a CSI volume, a PersistentVolumeClaim or a generic ephemeral volume: the
//     kubelet hands a CSI driver the pod's ServiceAccount tokens for the
//     audiences its CSIDriver object asks for (tokenRequests), which it may
//     put in the volume; a lifecycle-only CCM needs no storage;
//   - shareProcessNamespace: the CCM could read the gate's token through
//     /proc/<pid>/root.
//
// The gate's own token volume is removed before and added after the check.
// Secrets that carry a ServiceAccount token are refused in tokenSecrets.
func tokenStaysInGate(spec *corev1.PodSpec, audiences []string) error {
	if spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace {
		return fmt.Errorf("%w: shareProcessNamespace would let the CCM read the gate's ServiceAccount token", ErrConfig)
	}
	// The gate's token volume replaces any of its name: a container of the
	// chart that mounts that name would get the gate's token.
	for kind, cs := range map[string][]corev1.Container{"initContainers": spec.InitContainers, "containers": spec.Containers} {
		for i, c := range cs {
			for j, vm := range c.VolumeMounts {
				if vm.Name == TokenVolume {
					return fmt.Errorf("%w: spec.template.spec.%s[%d].volumeMounts[%d]: container %q mounts %q, the name of the gate's ServiceAccount token volume", ErrConfig, kind, i, j, c.Name, TokenVolume)
				}
			}
		}
	}
	for i, v := range spec.Volumes {
		field := fmt.Sprintf("spec.template.spec.volumes[%d]", i)
		switch {
		case v.CSI != nil:
			return fmt.Errorf("%w: %s.csi: volume %q is a CSI volume (driver %q): a CSI driver may be given the pod's ServiceAccount tokens and put them into the volume; a native CCM needs no storage", ErrConfig, field, v.Name, v.CSI.Driver)
		case v.PersistentVolumeClaim != nil:
			return fmt.Errorf("%w: %s.persistentVolumeClaim: volume %q mounts a PersistentVolumeClaim, whose CSI driver may be given the pod's ServiceAccount tokens; a native CCM needs no storage", ErrConfig, field, v.Name)
		case v.Ephemeral != nil:
			return fmt.Errorf("%w: %s.ephemeral: volume %q is a generic ephemeral volume, whose CSI driver may be given the pod's ServiceAccount tokens; a native CCM needs no storage", ErrConfig, field, v.Name)
		case v.Projected == nil:
			continue
		}
		for j, src := range v.Projected.Sources {
			t := src.ServiceAccountToken
			if t == nil {
				continue
			}
			srcField := fmt.Sprintf("%s.projected.sources[%d].serviceAccountToken.audience", field, j)
			switch {
			case t.Audience == "":
				return fmt.Errorf("%w: %s: volume %q projects a ServiceAccount token for the API server (no audience); only the gate may hold one", ErrConfig, srcField, v.Name)
			case !slices.Contains(audiences, t.Audience):
				return fmt.Errorf("%w: %s: volume %q projects a ServiceAccount token for audience %q, which the profile does not declare in ccm.tokenAudiences (declared: %q); a token the API server accepts would let the CCM around the gate", ErrConfig, srcField, v.Name, t.Audience, audiences)
			}
		}
	}
	return nil
}

// tokenSecrets refuses a rendered Secret that carries a ServiceAccount token:
// of type kubernetes.io/service-account-token, or naming a ServiceAccount in
// the annotation kubernetes.io/service-account.name. The API server's token
// controller writes a token that never expires into such a Secret, for the
// release's ServiceAccount as readily as for any other, and any container
// could mount it or take it as an environment variable.
func tokenSecrets(m *release.Manifests) error {
	for _, o := range m.Objects {
		if o.GetKind() != "Secret" {
			continue
		}
		typ, _, _ := unstructured.NestedString(o.Object, "type")
		sa := o.GetAnnotations()[corev1.ServiceAccountNameKey]
		if typ == string(corev1.SecretTypeServiceAccountToken) || sa != "" {
			return fmt.Errorf("%w: Secret %s/%s (type %q, ServiceAccount %q) would carry a ServiceAccount token the API server accepts; only the gate may hold one", ErrConfig, o.GetNamespace(), o.GetName(), typ, sa)
		}
	}
	return nil
}

func (s Sidecar) configMap(kubeconfig []byte) (*unstructured.Unstructured, error) {
	cm := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: s.ConfigMapName(), Namespace: s.Namespace,
			Labels: map[string]string{
				release.ManagedByLabel: release.ManagedByValue,
				release.NativeCCMLabel: s.Release,
				release.PlatformLabel:  s.Platform,
			},
		},
		Data: map[string]string{kubeconfigKey: string(kubeconfig)},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cm)
	if err != nil {
		return nil, err
	}
	unstructured.RemoveNestedField(obj, "metadata", "creationTimestamp")
	return &unstructured.Unstructured{Object: obj}, nil
}

// apiServerFlags say where the CCM finds its API server; kubeconfigFlags are
// set to the gate's kubeconfig.
var (
	kubeconfigFlags = []string{"--kubeconfig", "--authentication-kubeconfig", "--authorization-kubeconfig"}
	apiServerFlags  = append([]string{"--master"}, kubeconfigFlags...)
)

// stripFlags removes flags (--name=value, --name value, -name, --na_me ...:
// names compared as the CCM's flag parser compares them) from args.
func stripFlags(args []string, names ...string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		_, _, hasValue := strings.Cut(args[i], "=")
		if name := profile.FlagName(args[i]); name == "" || !slices.Contains(names, name) {
			out = append(out, args[i])
			continue
		}
		if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++ // the value was the next argument
		}
	}
	return out
}

func setMount(mounts []corev1.VolumeMount, add ...corev1.VolumeMount) []corev1.VolumeMount {
	for _, a := range add {
		mounts = slices.DeleteFunc(mounts, func(m corev1.VolumeMount) bool { return m.Name == a.Name || m.MountPath == a.MountPath })
		mounts = append(mounts, a)
	}
	return mounts
}

func setVolume(vols []corev1.Volume, add ...corev1.Volume) []corev1.Volume {
	for _, a := range add {
		vols = slices.DeleteFunc(vols, func(v corev1.Volume) bool { return v.Name == a.Name })
		vols = append(vols, a)
	}
	return vols
}
