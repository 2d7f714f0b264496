package gate_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/helm"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest/ccmflags"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const gateImage = "ghcr.io/hybrid-ccm/ccm-gate:test"

// renderGated renders a built-in profile's release with the gate sidecar.
func renderGated(t *testing.T, name string) (release.Request, gate.Sidecar, []*unstructured.Unstructured) {
	t.Helper()
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	p, ok := set.Get(name)
	if !ok {
		t.Fatalf("no profile %s", name)
	}
	req, err := release.FromProfile(p, release.Instance{ReleaseName: "native-ccm-" + name, Namespace: "kube-system", Platform: p.Platforms[0]})
	if err != nil {
		t.Fatal(err)
	}
	s := gate.SidecarFor(req.Lifecycle, gateImage)
	req.Mutators = []release.Mutator{s}
	out, err := helm.NewEngine(nil, helm.Options{}).Render(context.Background(), req)
	var chartErr *release.ChartError
	if errors.As(err, &chartErr) {
		t.Skipf("profile %s: chart not available offline: %v", name, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return req, s, decodeAll(t, out)
}

func decodeAll(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// podOf returns the pod template of the CCM workload.
func podOf(t *testing.T, objs []*unstructured.Unstructured, release string) (*unstructured.Unstructured, corev1.PodTemplateSpec) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet" {
			continue
		}
		raw, _, _ := unstructured.NestedMap(o.Object, "spec", "template")
		var tpl corev1.PodTemplateSpec
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &tpl); err != nil {
			t.Fatal(err)
		}
		if tpl.Labels["hybridccm.io/native-ccm"] == release {
			return o, tpl
		}
	}
	t.Fatalf("no workload of %s", release)
	return nil, corev1.PodTemplateSpec{}
}

func TestSidecarEveryProfile(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range set.Names() {
		t.Run(name, func(t *testing.T) {
			req, s, objs := renderGated(t, name)
			_, tpl := podOf(t, objs, req.Name)
			spec := tpl.Spec

			// The gate is the first init container, a native sidecar.
			if len(spec.InitContainers) == 0 || spec.InitContainers[0].Name != gate.SidecarName {
				t.Fatalf("init containers %v: the gate must come first", spec.InitContainers)
			}
			g := spec.InitContainers[0]
			if g.RestartPolicy == nil || *g.RestartPolicy != corev1.ContainerRestartPolicyAlways || g.StartupProbe == nil {
				t.Errorf("gate is not a native sidecar with a startup probe: %+v", g)
			}
			for _, want := range []string{"--platform=" + req.Lifecycle.Platform, "--credentials=own", "--client-token-file=" + gate.ClientTokenPath, "--tls-dir=" + gate.TLSDir} {
				if !slices.Contains(g.Args, want) {
					t.Errorf("gate args %v lack %s", g.Args, want)
				}
			}
			if g.Image != gateImage {
				t.Errorf("gate image %s", g.Image)
			}

			// The CCM's only API server is the gate.
			ccm := spec.Containers[0]
			if req.Lifecycle.Workload != nil && req.Lifecycle.Workload.Container != "" {
				ccm = spec.Containers[slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == req.Lifecycle.Workload.Container })]
			}
			all := append(slices.Clone(ccm.Command), ccm.Args...)
			var kubeconfigs []string
			for _, a := range all {
				if strings.Contains(a, "kubeconfig") {
					kubeconfigs = append(kubeconfigs, a)
				}
				if strings.HasPrefix(a, "--master") {
					t.Errorf("CCM keeps %s", a)
				}
			}
			if want := ccmKubeconfigFlags(); !slices.Equal(kubeconfigs, want) {
				t.Errorf("CCM kubeconfig flags %v, want %v", kubeconfigs, want)
			}

			// Only the gate holds the ServiceAccount token.
			onlyGateHoldsToken(t, spec)
			mounts := map[string]string{}
			for _, m := range ccm.VolumeMounts {
				mounts[m.MountPath] = m.Name
			}
			if mounts["/etc/ccm-gate"] == "" || mounts[gate.TLSDir] == "" {
				t.Errorf("CCM mounts %v", ccm.VolumeMounts)
			}
			if tpl.Annotations[gate.KubeconfigAnnotation] == "" {
				t.Error("no kubeconfig digest on the pod template")
			}

			// The kubeconfig: loopback, the gate's CA, the CCM's own token.
			var cm *unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() == "ConfigMap" && o.GetName() == s.ConfigMapName() {
					cm = o
				}
			}
			if cm == nil {
				t.Fatal("no kubeconfig ConfigMap")
			}
			data, _, _ := unstructured.NestedString(cm.Object, "data", "kubeconfig")
			kc, err := clientcmd.Load([]byte(data))
			if err != nil {
				t.Fatal(err)
			}
			cluster := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster]
			user := kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo]
			if !strings.HasPrefix(cluster.Server, "https://127.0.0.1:") || cluster.CertificateAuthority != gate.TLSDir+"/"+proxy.CertFile {
				t.Errorf("cluster %+v", cluster)
			}
			if user.TokenFile != gate.ClientTokenPath || user.Token != "" || len(user.ClientCertificateData) > 0 {
				t.Errorf("user %+v: want only the gate's client token file", user)
			}
		})
	}
}

func TestSidecarRewritesCCMFlags(t *testing.T) {
	dep := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "ccm", Namespace: "kube-system"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{release.NativeCCMLabel: "native-ccm-x"}},
			Spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: gate.SidecarName, Image: "old"}, {Name: "other", Image: "busybox"}},
				Containers: []corev1.Container{{
					Name:    "ccm",
					Command: []string{"/ccm", "--master", "https://10.0.0.1:6443", "--v=2"},
					Args:    []string{"--kubeconfig", "/etc/kubernetes/ccm.conf", "--cloud-provider=x", "-master=https://evil", "--controllers=cloud-node-lifecycle"},
				}},
			},
		}},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(dep)
	if err != nil {
		t.Fatal(err)
	}
	m := &release.Manifests{Objects: []*unstructured.Unstructured{{Object: obj}}}
	s := gate.Sidecar{Release: "native-ccm-x", Namespace: "kube-system", Platform: "x", Image: gateImage, ProxyPort: 20000, HealthPort: 21000}
	for range 2 { // idempotent: a second run changes nothing more
		if err := s.Mutate(m); err != nil {
			t.Fatal(err)
		}
	}
	_, tpl := podOf(t, m.Objects, "native-ccm-x")
	c := tpl.Spec.Containers[0]
	if !slices.Equal(c.Command, []string{"/ccm", "--v=2"}) {
		t.Errorf("command %v", c.Command)
	}
	// the gate's flags first: nothing before them may take one as its value
	if want := append(ccmKubeconfigFlags(), "--cloud-provider=x", "--controllers=cloud-node-lifecycle"); !slices.Equal(c.Args, want) {
		t.Errorf("args %v, want %v", c.Args, want)
	}
	onlyGateHoldsToken(t, tpl.Spec)
	var inits []string
	for _, ic := range tpl.Spec.InitContainers {
		inits = append(inits, ic.Name+"="+ic.Image)
	}
	if !slices.Equal(inits, []string{gate.SidecarName + "=" + gateImage, "other=busybox"}) {
		t.Errorf("init containers %v", inits)
	}
	cms := m.Find("ConfigMap")
	if len(cms) != 1 {
		t.Errorf("%d ConfigMaps after two runs", len(cms))
	}
	if len(tpl.Spec.Volumes) != 3 || len(c.VolumeMounts) != 2 {
		t.Errorf("volumes %v mounts %v", tpl.Spec.Volumes, c.VolumeMounts)
	}

	t.Run("chart projects an API server token", func(t *testing.T) {
		// A chart (or override) that projects the ServiceAccount's token into
		// the CCM would give it a way around the view.
		d := dep.DeepCopy()
		d.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "my-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}},
		}}}}
		d.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "my-token", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}}
		o, err := runtime.DefaultUnstructuredConverter.ToUnstructured(d)
		if err != nil {
			t.Fatal(err)
		}
		err = s.Mutate(&release.Manifests{Objects: []*unstructured.Unstructured{{Object: o}}})
		if !errors.Is(err, gate.ErrConfig) || !strings.Contains(err.Error(), `"my-token"`) {
			t.Fatalf("err %v, want a configuration error naming the volume", err)
		}
		// A token for an audience the profile declares (a cloud's workload identity) stays.
		d.Spec.Template.Spec.Volumes[0].Projected.Sources[0].ServiceAccountToken.Audience = "sts.amazonaws.com"
		d.Spec.Template.Spec.Containers[0].VolumeMounts[0].MountPath = "/var/run/secrets/eks.amazonaws.com/serviceaccount"
		if o, err = runtime.DefaultUnstructuredConverter.ToUnstructured(d); err != nil {
			t.Fatal(err)
		}
		declared := s
		declared.TokenAudiences = []string{"sts.amazonaws.com"}
		if err := declared.Mutate(&release.Manifests{Objects: []*unstructured.Unstructured{{Object: o}}}); err != nil {
			t.Fatalf("token for a declared audience: %v", err)
		}
		s := declared
		// One process namespace: the CCM could read the gate's token in /proc.
		d.Spec.Template.Spec.ShareProcessNamespace = ptr.To(true)
		if o, err = runtime.DefaultUnstructuredConverter.ToUnstructured(d); err != nil {
			t.Fatal(err)
		}
		if err := s.Mutate(&release.Manifests{Objects: []*unstructured.Unstructured{{Object: o}}}); !errors.Is(err, gate.ErrConfig) || !strings.Contains(err.Error(), "shareProcessNamespace") {
			t.Fatalf("shareProcessNamespace: %v, want a configuration error naming it", err)
		}
	})
	t.Run("no workload", func(t *testing.T) {
		if err := s.Mutate(&release.Manifests{}); err == nil {
			t.Fatal("want an error without a CCM workload")
		}
	})
	t.Run("no platform", func(t *testing.T) {
		bad := s
		bad.Platform = ""
		if err := bad.Mutate(m); err == nil {
			t.Fatal("want an error without a platform")
		}
	})
	t.Run("default load balancers without a class", func(t *testing.T) {
		bad := s
		bad.DefaultLoadBalancerClass = true
		if err := bad.Mutate(m); !errors.Is(err, gate.ErrConfig) {
			t.Fatalf("want a configuration error, got %v", err)
		}
	})
	t.Run("fingerprint follows the settings", func(t *testing.T) {
		other := s
		other.Image = "ghcr.io/hybrid-ccm/ccm-gate:v2"
		if s.Fingerprint() == other.Fingerprint() || s.Fingerprint() != s.Fingerprint() {
			t.Fatal("fingerprint must change with the image and only then")
		}
	})
}

// TestSidecarLoadBalancerClass: the view of Services is passed as flags, and
// a release without load balancers keeps its fingerprint (no rollout).
func TestSidecarLoadBalancerClass(t *testing.T) {
	base := gate.Sidecar{Release: "native-ccm-x", Namespace: "kube-system", Platform: "x", Image: gateImage, ProxyPort: 20000, HealthPort: 21000}
	tests := []struct {
		name string
		// class and isDefault configure the sidecar.
		class     string
		isDefault bool
		// want are the gate's Service flags.
		want []string
	}{
		{name: "load balancers off"},
		{name: "own class", class: "hybridccm.io/x", want: []string{"--load-balancer-class=hybridccm.io/x"}},
		{name: "own class and the default", class: "hybridccm.io/x", isDefault: true,
			want: []string{"--load-balancer-class=hybridccm.io/x", "--default-load-balancer-class"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dep := &appsv1.Deployment{
				TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
				ObjectMeta: metav1.ObjectMeta{Name: "ccm", Namespace: "kube-system"},
				Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{release.NativeCCMLabel: "native-ccm-x"}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "ccm", Command: []string{"/ccm"}}}},
				}},
			}
			obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(dep)
			if err != nil {
				t.Fatal(err)
			}
			m := &release.Manifests{Objects: []*unstructured.Unstructured{{Object: obj}}}
			s := base
			s.LoadBalancerClass, s.DefaultLoadBalancerClass = tc.class, tc.isDefault
			if err := s.Mutate(m); err != nil {
				t.Fatal(err)
			}
			_, tpl := podOf(t, m.Objects, "native-ccm-x")
			var got []string
			for _, c := range tpl.Spec.InitContainers {
				if c.Name != gate.SidecarName {
					continue
				}
				for _, a := range c.Args {
					if strings.HasPrefix(a, "--load-balancer-class") || strings.HasPrefix(a, "--default-load-balancer-class") {
						got = append(got, a)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("gate flags %v, want %v", got, tc.want)
			}
			if (s.Fingerprint() == base.Fingerprint()) != (tc.class == "") {
				t.Fatal("the fingerprint must change with the load-balancer settings, and only then")
			}
		})
	}
}

// ccmKubeconfigFlags are the CCM's flags naming an API server: all the gate.
func ccmKubeconfigFlags() []string {
	return []string{"--kubeconfig=" + gate.KubeconfigPath, "--authentication-kubeconfig=" + gate.KubeconfigPath, "--authorization-kubeconfig=" + gate.KubeconfigPath}
}

// onlyGateHoldsToken: the pod automounts no token, the gate mounts the
// projected ServiceAccount token at the in-cluster path, and no other
// container mounts that volume, a projected API server token, or the gate's
// token directory.
func onlyGateHoldsToken(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken %v, want false", spec.AutomountServiceAccountToken)
	}
	tokenVolumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil && src.ServiceAccountToken.Audience == "" {
				tokenVolumes[v.Name] = true
			}
		}
	}
	if !tokenVolumes[gate.TokenVolume] || len(tokenVolumes) != 1 {
		t.Errorf("volumes with an API server token %v, want only %s", tokenVolumes, gate.TokenVolume)
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, m := range c.VolumeMounts {
			holds := tokenVolumes[m.Name] || strings.HasPrefix(m.MountPath, "/var/run/secrets/kubernetes.io")
			if c.Name == gate.SidecarName {
				if m.Name == gate.TokenVolume && m.MountPath != gate.ServiceAccountDir {
					t.Errorf("gate mounts its token at %s", m.MountPath)
				}
				continue
			}
			if holds {
				t.Errorf("container %s mounts %s at %s: only the gate may hold the ServiceAccount token", c.Name, m.Name, m.MountPath)
			}
		}
		if c.Name == gate.SidecarName && !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == gate.TokenVolume }) {
			t.Errorf("gate does not mount %s", gate.TokenVolume)
		}
	}
}

// TestSidecarManifestsValidate sends the gated manifests to the real API
// server as a dry run: the pod template (native sidecar, probes, volumes) and
// the ConfigMap are valid objects.
func TestSidecarManifestsValidate(t *testing.T) {
	e := needEnv(t)
	_, _, objs := renderGated(t, "hcloud")
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment", "DaemonSet", "ConfigMap":
		default:
			continue
		}
		var buf bytes.Buffer
		if err := unstructured.UnstructuredJSONScheme.Encode(o, &buf); err != nil {
			t.Fatal(err)
		}
		res := e.Client.AppsV1().RESTClient().Post()
		if o.GetKind() == "ConfigMap" {
			res = e.Client.CoreV1().RESTClient().Post()
		}
		plural := strings.ToLower(o.GetKind()) + "s"
		err := res.Namespace(o.GetNamespace()).Resource(plural).Param("dryRun", "All").
			SetHeader("Content-Type", "application/json").Body(buf.Bytes()).Do(context.Background()).Error()
		if err != nil {
			t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// The view, the fence and the coordinator's API key on the same label.
func TestPlatformLabelAgrees(t *testing.T) {
	if names.PlatformLabel != names.PlatformLabel {
		t.Fatalf("proxy label %q, API label %q", names.PlatformLabel, names.PlatformLabel)
	}
}

// TestSidecarKubeconfigCannotBeSwallowed: the gate's kubeconfig flags come
// first in the CCM's args, so a chart arg without a value cannot take one
// (the CCM's own flag set parses the result); a command that would take the
// first arg as a value once the gate removed its kubeconfig flag is refused.
func TestSidecarKubeconfigCannotBeSwallowed(t *testing.T) {
	pod := func(command, args []string) *release.Manifests {
		dep := &appsv1.Deployment{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
			ObjectMeta: metav1.ObjectMeta{Name: "ccm", Namespace: "kube-system"},
			Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{release.NativeCCMLabel: "native-ccm-x"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "ccm", Command: command, Args: args}}},
			}},
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(dep)
		if err != nil {
			t.Fatal(err)
		}
		return &release.Manifests{Objects: []*unstructured.Unstructured{{Object: obj}}}
	}
	s := gate.Sidecar{Release: "native-ccm-x", Namespace: "kube-system", Platform: "x", Image: gateImage, ProxyPort: 20000, HealthPort: 21000}

	m := pod([]string{"/ccm"}, []string{"--cloud-provider=x", "--cluster-name"})
	if err := s.Mutate(m); err != nil {
		t.Fatal(err)
	}
	_, tpl := podOf(t, m.Objects, "native-ccm-x")
	// a last arg so that the chart's --cluster-name has its value
	fs, err := ccmflags.Parse(t, append(tpl.Spec.Containers[0].Args, "--v=2"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"kubeconfig", "authentication-kubeconfig", "authorization-kubeconfig"} {
		if got := ccmflags.Value(t, fs, f); got != gate.KubeconfigPath {
			t.Errorf("the CCM runs with --%s=%q, want %s (args %q)", f, got, gate.KubeconfigPath, tpl.Spec.Containers[0].Args)
		}
	}

	m = pod([]string{"/ccm", "--cluster-name", "--kubeconfig=/etc/kubernetes/ccm.conf"}, nil)
	if err := s.Mutate(m); !errors.Is(err, release.ErrSwallowingCommand) || !strings.Contains(err.Error(), `"--cluster-name"`) {
		t.Errorf("err = %v, want %v naming --cluster-name", err, release.ErrSwallowingCommand)
	}
}

// tokenChart is a rendered chart whose CCM container mounts volume "v"
// (VOLUME), beside EXTRA objects.
const tokenChart = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: ccm, namespace: kube-system}
spec:
  selector: {matchLabels: {app: ccm}}
  template:
    metadata: {labels: {app: ccm}}
    spec:
      containers:
        - name: ccm
          image: upstream/ccm:1
          args: [--cloud-provider=aws]
          volumeMounts: [{name: MOUNT, mountPath: /var/run/secrets/tokens}]
      volumes: [{name: v, VOLUME}]
EXTRA`

// TestTokenProjectionsNeedADeclaredAudience: no container but the gate may
// hold a token the API server could accept (issue 22 item 6). Through the
// lifecycle and gate mutators, a rendered chart is refused, naming the field,
// when it projects a ServiceAccount token for an audience its profile does
// not declare in ccm.tokenAudiences (none: the API server; the API server's
// own issuer), a volume a CSI driver fills (it may be handed the pod's
// tokens), a Secret that carries a ServiceAccount token, or a mount of the
// gate's token volume; a token for a declared audience stays.
func TestTokenProjectionsNeedADeclaredAudience(t *testing.T) {
	projected := func(audience string) string {
		return `projected: {sources: [{serviceAccountToken: {path: token, audience: "` + audience + `"}}]}`
	}
	for _, tc := range []struct {
		name, volume, mount, extra string
		audiences                  []string
		want                       string // in the error; "": accepted
	}{
		{name: "no audience", volume: projected(""), audiences: []string{"sts.amazonaws.com"},
			want: `spec.template.spec.volumes[0].projected.sources[0].serviceAccountToken.audience: volume "v" projects a ServiceAccount token for the API server`},
		{name: "the API server's issuer", volume: projected("https://kubernetes.default.svc.cluster.local"), audiences: []string{"sts.amazonaws.com"},
			want: `audience "https://kubernetes.default.svc.cluster.local", which the profile does not declare in ccm.tokenAudiences`},
		{name: "undeclared cloud audience", volume: projected("sts.amazonaws.com"),
			want: `audience "sts.amazonaws.com", which the profile does not declare`},
		{name: "declared cloud audience", volume: projected("sts.amazonaws.com"), audiences: []string{"sts.amazonaws.com"}},
		{name: "csi", volume: `csi: {driver: secrets-store.csi.k8s.io}`, audiences: []string{"sts.amazonaws.com"},
			want: `spec.template.spec.volumes[0].csi: volume "v" is a CSI volume`},
		{name: "pvc", volume: `persistentVolumeClaim: {claimName: data}`, want: `volumes[0].persistentVolumeClaim`},
		{name: "ephemeral", volume: `ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Mi}}}}}`,
			want: `volumes[0].ephemeral`},
		{name: "service-account-token Secret", volume: `secret: {secretName: tok}`,
			extra: "---\napiVersion: v1\nkind: Secret\nmetadata: {name: tok, namespace: kube-system}\ntype: kubernetes.io/service-account-token\n",
			want:  `Secret kube-system/tok (type "kubernetes.io/service-account-token"`},
		{name: "Secret naming a ServiceAccount", volume: `secret: {secretName: tok}`,
			extra: "---\napiVersion: v1\nkind: Secret\nmetadata: {name: tok, namespace: kube-system, annotations: {kubernetes.io/service-account.name: native-ccm-aws}}\n",
			want:  `ServiceAccount "native-ccm-aws"`},
		{name: "plain Secret", volume: `secret: {secretName: creds}`,
			extra: "---\napiVersion: v1\nkind: Secret\nmetadata: {name: creds, namespace: kube-system}\ntype: Opaque\n"},
		{name: "the gate's token volume", volume: `emptyDir: {}`, mount: gate.TokenVolume,
			want: `spec.template.spec.containers[0].volumeMounts[0]: container "ccm" mounts "ccm-gate-serviceaccount"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mount := "v"
			if tc.mount != "" {
				mount = tc.mount
			}
			doc := strings.NewReplacer("VOLUME", tc.volume, "MOUNT", mount, "EXTRA", tc.extra).Replace(tokenChart)
			m, err := release.ParseManifests([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			l := release.Lifecycle{Release: "native-ccm-aws", Namespace: "kube-system", Platform: "aws", LeaseName: "native-ccm-aws", SecurePort: 10270,
				TokenAudiences: tc.audiences}
			if err := l.Mutate(m); err != nil {
				t.Fatal(err)
			}
			err = gate.SidecarFor(l, gateImage).Mutate(m)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				_, tpl := podOf(t, m.Objects, "native-ccm-aws")
				onlyGateHoldsToken(t, tpl.Spec)
				return
			}
			if !errors.Is(err, gate.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %v with %q", err, gate.ErrConfig, tc.want)
			}
		})
	}
}
