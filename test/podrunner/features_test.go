package podrunner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiwait "k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// TestPodFeatures runs a pod using everything the runner supports and checks
// what the program saw and what the API server says about the pod.
func TestPodFeatures(t *testing.T) {
	ns, r := namespace(t), newRunner(t)
	ctx := ctxFor(t)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: ns}, Data: map[string][]byte{"token": []byte("s3cret"), "other": []byte("o")}})
	create(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "conf", Namespace: ns}, Data: map[string]string{"region": "eu-1", "cloud.conf": "[Global]\n"}})
	create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ccm", Namespace: ns}})
	httpPort, tlsPort := port(), port()
	spec := corev1.PodSpec{
		ServiceAccountName: "ccm",
		Containers: []corev1.Container{{
			Name:  "ccm",
			Image: testImage,
			Args: []string{
				"--name=$(NAME)", "--literal=$$(NAME)", "--unknown=$(NOPE)", "--in-cluster",
				"--listen=127.0.0.1:" + itoa(httpPort), "--tls-listen=127.0.0.1:" + itoa(tlsPort),
				"--files=/etc/creds/token,/etc/creds/other,/etc/conf/cloud.conf,/etc/cloud.conf,/etc/info/labels,/etc/info/namespace,/etc/proj/token,/etc/proj/ca.crt,/etc/proj/namespace,/etc/proj/region,/var/run/secrets/kubernetes.io/serviceaccount/namespace",
				"--try-write=/etc/creds,/scratch,/tmp,/scratch-ro,/",
			},
			Env: []corev1.EnvVar{
				{Name: "NAME", Value: "ccm-$(POD_NAME)"}, // POD_NAME is not defined yet: stays
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "GREETING", Value: "hello $(POD_NAME) in $(NAMESPACE)"},
				{Name: "NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
				{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
				{Name: "NOTE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['note']"}}},
				{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
				{Name: "SA", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.serviceAccountName"}}},
				{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "token"}}},
				{Name: "REGION", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}, Key: "region"}}},
				{Name: "MISSING", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Key: "x", Optional: ptr.To(true)}}},
				{Name: "OVERRIDDEN", Value: "pod"},
			},
			EnvFrom: []corev1.EnvFromSource{{Prefix: "CONF_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}}}},
			VolumeMounts: []corev1.VolumeMount{
				{Name: "creds", MountPath: "/etc/creds"},
				{Name: "conf", MountPath: "/etc/conf"},
				{Name: "conf", MountPath: "/etc/cloud.conf", SubPath: "cloud.conf"},
				{Name: "scratch", MountPath: "/scratch"},
				{Name: "scratch", MountPath: "/scratch-ro", ReadOnly: true},
				{Name: "info", MountPath: "/etc/info"},
				{Name: "proj", MountPath: "/etc/proj"},
			},
			ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("https"), Scheme: corev1.URISchemeHTTPS}}, PeriodSeconds: 1},
			LivenessProbe:   &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(httpPort)}}, PeriodSeconds: 1},
			Ports:           []corev1.ContainerPort{{Name: "https", ContainerPort: int32(tlsPort)}},
			SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](1234), ReadOnlyRootFilesystem: ptr.To(true)},
		}},
		SecurityContext: &corev1.PodSecurityContext{RunAsGroup: ptr.To[int64](2345), SupplementalGroups: []int64{3456}, FSGroup: ptr.To[int64](4567)},
		Volumes: []corev1.Volume{
			{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds", Items: []corev1.KeyToPath{{Key: "token", Path: "token", Mode: ptr.To[int32](0o400)}}}}}, // 0400: readable through fsGroup
			{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}},
			}}}},
			{Name: "proj", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3600)}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}, Items: []corev1.KeyToPath{{Key: "region", Path: "region"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
			}}}},
		},
	}
	create(t, deployment(ns, "features", spec))
	d, err := r.RunDeployment(ctx, ns, "features")
	if err != nil {
		t.Fatal(err)
	}
	pods, err := d.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := pods[0]
	rep := reportOf(t, p, "ccm")

	// Identity, user, command line.
	if want := "system:serviceaccount:" + ns + ":ccm"; rep.User != want || rep.PodName != p.Name() {
		t.Errorf("in-cluster identity = %q (pod %q, error %q), want %q bound to pod %q", rep.User, rep.PodName, rep.APIError, want, p.Name())
	}
	if rep.Hostname != p.Name() {
		t.Errorf("host name = %q, want the pod's name %q (leader election names the holder after it)", rep.Hostname, p.Name())
	}
	if rep.UID != 1234 || rep.GID != 2345 || !containsInt(rep.Groups, 3456) || !containsInt(rep.Groups, 4567) {
		t.Errorf("uid/gid/groups = %d/%d/%v, want 1234 (container), 2345 (pod), with 3456 and fsGroup 4567", rep.UID, rep.GID, rep.Groups)
	}
	if rep.Cwd != "/work" {
		t.Errorf("working directory %q, want the image's /work", rep.Cwd)
	}
	for _, want := range []string{"--name=ccm-$(POD_NAME)", "--literal=$(NAME)", "--unknown=$(NOPE)"} {
		if !containsStr(rep.Args, want) {
			t.Errorf("args %q lack %q", rep.Args, want)
		}
	}
	if containsStr(rep.Args, "--name=from-image-cmd") {
		t.Errorf("args %q include the image's Cmd although the pod sets args", rep.Args)
	}

	// Environment.
	wantEnv := map[string]string{
		"GREETING":                "hello " + p.Name() + " in $(NAMESPACE)",
		"POD_NAME":                p.Name(),
		"NAMESPACE":               ns,
		"POD_UID":                 p.UID(),
		"APP":                     "features",
		"NOTE":                    "from-template",
		"NODE":                    "podrunner-test-node",
		"SA":                      "ccm",
		"POD_IP":                  "127.0.0.1",
		"TOKEN":                   "s3cret",
		"REGION":                  "eu-1",
		"CONF_region":             "eu-1",
		"FROM_IMAGE":              "image",
		"OVERRIDDEN":              "pod",
		"KUBERNETES_SERVICE_HOST": "127.0.0.1",
	}
	for k, v := range wantEnv {
		if rep.Env[k] != v {
			t.Errorf("env %s = %q, want %q", k, rep.Env[k], v)
		}
	}
	if _, ok := rep.Env["MISSING"]; ok {
		t.Errorf("optional env from a missing ConfigMap is set")
	}

	// Files.
	wantFiles := map[string]string{
		"/etc/creds/token":     "s3cret",
		"/etc/creds/other":     "error: open /etc/creds/other: no such file or directory", // not among the items
		"/etc/conf/cloud.conf": "[Global]\n",
		"/etc/cloud.conf":      "[Global]\n", // subPath
		"/etc/info/labels":     `app="features"` + "\n" + `pod-template-hash="`,
		"/etc/info/namespace":  ns,
		"/etc/proj/ca.crt":     "-----BEGIN CERTIFICATE-----",
		"/etc/proj/namespace":  ns,
		"/etc/proj/region":     "eu-1",
		"/etc/proj/token":      "ey",
		"/var/run/secrets/kubernetes.io/serviceaccount/namespace": ns,
	}
	for f, want := range wantFiles {
		if got := rep.Files[f]; !strings.HasPrefix(got, want) {
			t.Errorf("file %s = %q, want it to start with %q", f, got, want)
		}
	}
	// Writes: emptyDir and /tmp yes; secret, readOnly mount and read-only root no.
	for dir, ok := range map[string]bool{"/etc/creds": false, "/scratch": true, "/tmp": true, "/scratch-ro": false, "/": false} {
		if got := rep.Writable[dir]; (got == "ok") != ok {
			t.Errorf("write to %s: %q, want writable=%v", dir, got, ok)
		}
	}

	// What the API server holds.
	pod := podObject(t, p, "Ready", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionTrue })
	if pod.Spec.NodeName != "podrunner-test-node" || pod.Status.Phase != corev1.PodRunning || pod.Labels["app"] != "features" || pod.Annotations["note"] != "from-template" {
		t.Errorf("pod node %q phase %q labels %v annotations %v", pod.Spec.NodeName, pod.Status.Phase, pod.Labels, pod.Annotations)
	}
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady} {
		if condition(pod, c) != corev1.ConditionTrue {
			t.Errorf("condition %s = %q", c, condition(pod, c))
		}
	}
	cs := containerStatus(pod, "ccm")
	if !cs.Ready || cs.Started == nil || !*cs.Started || cs.State.Running == nil || cs.RestartCount != 0 || !strings.HasPrefix(cs.ImageID, "sha256:") {
		t.Errorf("container status %+v", cs)
	}
	// The Deployment's and ReplicaSet's status follow the pod's (the runner
	// re-derives them every sync period, like the controllers would).
	var dep *appsv1.Deployment
	var rss *appsv1.ReplicaSetList
	statusOK := func() bool {
		s := dep.Status
		return s.ObservedGeneration == dep.Generation && s.Replicas == 1 && s.ReadyReplicas == 1 && s.AvailableReplicas == 1 && s.UpdatedReplicas == 1 &&
			len(rss.Items) == 1 && rss.Items[0].Status.ReadyReplicas == 1
	}
	if err := apiwait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if dep, err = env.Client.AppsV1().Deployments(ns).Get(ctx, "features", metav1.GetOptions{}); err != nil {
			return false, err
		}
		if rss, err = env.Client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{}); err != nil {
			return false, err
		}
		return statusOK(), nil
	}); err != nil {
		t.Errorf("deployment status %+v, replica sets %+v: %v", dep.Status, rss.Items, err)
	}
	if rss != nil && len(rss.Items) == 1 && pod.OwnerReferences[0].Name != rss.Items[0].Name {
		t.Errorf("pod owners %v, want the replica set %s", pod.OwnerReferences, rss.Items[0].Name)
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func containsStr(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func itoa(i int) string { return strconvItoa(i) }
