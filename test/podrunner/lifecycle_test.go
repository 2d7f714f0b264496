package podrunner_test

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/test/podrunner"
)

// TestInitAndSidecarOrder: a regular init container completes, then a native
// sidecar (mapped binary) runs and passes its startup probe, then the app
// starts; each appends its name to a shared file when it counts as started.
func TestInitAndSidecarOrder(t *testing.T) {
	ns, r := namespace(t), newRunner(t)
	ctx := ctxFor(t)
	sidePort := port()
	order := "--order-file=/shared/order"
	mount := []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
	spec := corev1.PodSpec{
		InitContainers: []corev1.Container{
			{Name: "init", Image: testImage, Args: []string{"--name=init", order, "--exit=0"}, VolumeMounts: mount},
			{
				Name: "gate", Image: mappedImage, RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				Args:         []string{"--name=gate", order, "--startup-failures=3", "--listen=127.0.0.1:" + itoa(sidePort)},
				StartupProbe: &corev1.Probe{ProbeHandler: httpProbe("/startz", sidePort).ProbeHandler, PeriodSeconds: 1, FailureThreshold: 30},
				VolumeMounts: mount,
			},
		},
		Containers: []corev1.Container{{Name: "app", Image: testImage, Args: []string{"--name=app", order, "--listen=127.0.0.1:" + itoa(port())}, VolumeMounts: mount}},
		Volumes:    []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
	}
	create(t, deployment(ns, "ordered", spec))
	d, err := r.RunDeployment(ctx, ns, "ordered")
	if err != nil {
		t.Fatal(err)
	}
	pods, err := d.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := reportOf(t, pods[0], "app").Order; got != "init\ngate\napp\n" {
		t.Errorf("start order %q, want init, gate (after its startup probe), app", got)
	}
	pod := podObject(t, pods[0], "Ready", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionTrue })
	if s := containerStatus(pod, "init"); s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 || s.State.Terminated.Reason != "Completed" {
		t.Errorf("init container status %+v", s)
	}
	if s := containerStatus(pod, "gate"); s.State.Running == nil || !s.Ready || s.Started == nil || !*s.Started {
		t.Errorf("sidecar status %+v", s)
	}
}

// TestCrashLoop: failing containers are restarted with back-off and their
// termination messages (file, or log tail with FallbackToLogsOnError) land
// in lastState.
func TestCrashLoop(t *testing.T) {
	ns, r := namespace(t), newRunner(t)
	ctx := ctxFor(t)
	spec := corev1.PodSpec{Containers: []corev1.Container{
		{Name: "file", Image: testImage, Args: []string{"--name=file", "--exit=3", "--message=cloud credentials rejected"}},
		{Name: "logs", Image: testImage, Args: []string{"--name=logs", "--exit=1", "--stderr=panic: no region"}, TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError},
		{Name: "custom", Image: testImage, Args: []string{"--name=custom", "--exit=4", "--message=custom path", "--message-path=/var/log/why"}, TerminationMessagePath: "/var/log/why"},
	}}
	create(t, deployment(ns, "crashing", spec))
	d, err := r.RunDeployment(ctx, ns, "crashing")
	if err != nil {
		t.Fatal(err)
	}
	var p *podrunner.Pod
	for p == nil {
		if pods := d.Pods(); len(pods) > 0 {
			p = pods[0]
		}
		if ctx.Err() != nil {
			t.Fatal("no pod")
		}
	}
	want := map[string]struct {
		code int32
		msg  string
	}{"file": {3, "cloud credentials rejected"}, "logs": {1, "panic: no region"}, "custom": {4, "custom path"}}
	pod := podObject(t, p, "two restarts of every container", func(pod *corev1.Pod) bool {
		for name := range want {
			if containerStatus(pod, name).RestartCount < 2 {
				return false
			}
		}
		return true
	})
	for name, w := range want {
		s := containerStatus(pod, name)
		last := s.LastTerminationState.Terminated
		if last == nil || last.ExitCode != w.code || last.Reason != "Error" || !strings.Contains(last.Message, w.msg) {
			t.Errorf("%s: lastState %+v, want exit %d with message %q", name, last, w.code, w.msg)
		}
	}
}

// TestProbes: a failing readiness probe makes the pod unready and back; a
// failing liveness probe restarts the container.
func TestProbes(t *testing.T) {
	ns, r := namespace(t), newRunner(t)
	ctx := ctxFor(t)
	pp := port()
	spec := corev1.PodSpec{Containers: []corev1.Container{{
		Name: "app", Image: testImage, Args: []string{"--name=app", "--listen=127.0.0.1:" + itoa(pp)},
		ReadinessProbe: httpProbe("/readyz", pp), LivenessProbe: httpProbe("/healthz", pp),
	}}}
	create(t, deployment(ns, "probed", spec))
	d, err := r.RunDeployment(ctx, ns, "probed")
	if err != nil {
		t.Fatal(err)
	}
	pods, err := d.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := pods[0]
	podObject(t, p, "Ready", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionTrue })

	setProbe(t, pp, "ready=false")
	pod := podObject(t, p, "not Ready", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionFalse })
	if s := containerStatus(pod, "app"); s.Ready || s.State.Running == nil || s.RestartCount != 0 {
		t.Errorf("unready container status %+v, want running, not ready, no restart", s)
	}
	setProbe(t, pp, "ready=true")
	podObject(t, p, "Ready again", func(p *corev1.Pod) bool { return condition(p, corev1.PodReady) == corev1.ConditionTrue })

	setProbe(t, pp, "live=false")
	pod = podObject(t, p, "a restart after the liveness probe failed", func(p *corev1.Pod) bool {
		s := containerStatus(p, "app")
		return s.RestartCount == 1 && s.Ready && s.State.Running != nil
	})
	if last := containerStatus(pod, "app").LastTerminationState.Terminated; last == nil || last.ExitCode == 0 {
		t.Errorf("lastState after the liveness kill %+v, want a failure", last)
	}
}

// TestNoAutomount: automountServiceAccountToken false on the pod or on the
// ServiceAccount leaves no token in the container.
func TestNoAutomount(t *testing.T) {
	for _, tc := range []struct {
		name     string
		podLevel *bool // the pod's automountServiceAccountToken
		saLevel  *bool // the ServiceAccount's
		token    bool  // whether the container finds a token
	}{
		{name: "default", token: true},
		{name: "pod-off", podLevel: ptr.To(false)},
		{name: "sa-off", saLevel: ptr.To(false)},
		{name: "pod-on-wins", podLevel: ptr.To(true), saLevel: ptr.To(false), token: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, r := namespace(t), newRunner(t)
			ctx := ctxFor(t)
			create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa", Namespace: ns}, AutomountServiceAccountToken: tc.saLevel})
			tok := "/var/run/secrets/kubernetes.io/serviceaccount/token"
			spec := corev1.PodSpec{ServiceAccountName: "sa", AutomountServiceAccountToken: tc.podLevel, Containers: []corev1.Container{{
				Name: "app", Image: testImage, Args: []string{"--name=app", "--in-cluster", "--files=" + tok, "--listen=127.0.0.1:" + itoa(port())},
			}}}
			create(t, deployment(ns, "app", spec))
			d, err := r.RunDeployment(ctx, ns, "app")
			if err != nil {
				t.Fatal(err)
			}
			pods, err := d.WaitReady(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rep := reportOf(t, pods[0], "app")
			hasToken := !strings.HasPrefix(rep.Files[tok], "error:")
			if hasToken != tc.token || (rep.User != "") != tc.token {
				t.Errorf("token file %q, identity %q (error %q); want a token: %v", rep.Files[tok], rep.User, rep.APIError, tc.token)
			}
		})
	}
}

// TestUnknownImage: an image neither in the layout nor mapped is an error
// naming it, the pod and the container, in WaitReady and in the Pod status.
func TestUnknownImage(t *testing.T) {
	ns, r := namespace(t), newRunner(t)
	ctx := ctxFor(t)
	create(t, deployment(ns, "lost", corev1.PodSpec{Containers: []corev1.Container{{Name: "ccm", Image: "ghcr.io/nowhere/ccm:9.9"}}}))
	d, err := r.RunDeployment(ctx, ns, "lost")
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.WaitReady(ctx)
	if err == nil || !strings.Contains(err.Error(), "ghcr.io/nowhere/ccm:9.9") || !strings.Contains(err.Error(), "container ccm") || !strings.Contains(err.Error(), "pod "+ns+"/lost-") {
		t.Fatalf("WaitReady error %v, want the image, pod and container named", err)
	}
	p := d.Pods()[0]
	pod := podObject(t, p, "ErrImagePull", func(p *corev1.Pod) bool {
		w := containerStatus(p, "ccm").State.Waiting
		return w != nil && w.Reason == "ErrImagePull"
	})
	if msg := containerStatus(pod, "ccm").State.Waiting.Message; !strings.Contains(msg, "ghcr.io/nowhere/ccm:9.9") {
		t.Errorf("waiting message %q does not name the image", msg)
	}
}

// TestManageRollout: Manage starts selected Deployments, rolls them on a
// template change, and stops them on scale to 0 and delete.
func TestManageRollout(t *testing.T) {
	ns, r := namespace(t), newRunner(t)
	ctx := ctxFor(t)
	if err := r.Manage(ctx, ns, "test=podrunner"); err != nil {
		t.Fatal(err)
	}
	pp := port()
	dep := deployment(ns, "rolled", corev1.PodSpec{Containers: []corev1.Container{{
		Name: "app", Image: testImage, Args: []string{"--name=v1", "--listen=127.0.0.1:" + itoa(pp)}, ReadinessProbe: httpProbe("/readyz", pp),
	}}})
	create(t, dep)
	var d *podrunner.Deployment
	for d == nil && ctx.Err() == nil {
		d = r.Deployment(ns, "rolled")
	}
	pods, err := d.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := pods[0]
	if got := reportOf(t, first, "app").Name; got != "v1" {
		t.Fatalf("first pod runs %q", got)
	}

	// A new template: a new pod with it, the old one gone.
	deps := env.Client.AppsV1().Deployments(ns)
	pp2 := port()
	cur := updateDeployment(t, ns, "rolled", func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].Args = []string{"--name=v2", "--listen=127.0.0.1:" + itoa(pp2)}
		d.Spec.Template.Spec.Containers[0].ReadinessProbe = httpProbe("/readyz", pp2)
	})
	var second *podrunner.Pod
	for second == nil && ctx.Err() == nil {
		pods, err := d.WaitReady(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if pods[0].Name() != first.Name() {
			second = pods[0]
		}
	}
	if got := reportOf(t, second, "app").Name; got != "v2" {
		t.Errorf("rolled pod runs %q, want v2", got)
	}
	<-first.Done()
	if _, err := env.Client.CoreV1().Pods(ns).Get(ctx, first.Name(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("old pod %s still there: %v", first.Name(), err)
	}
	waitDeployment(t, ns, "rolled", "rolled out", func(s appsStatus) bool {
		return s.ObservedGeneration == cur.Generation && s.Replicas == 1 && s.UpdatedReplicas == 1 && s.ReadyReplicas == 1
	})

	// Scale to 0: no pods.
	updateDeployment(t, ns, "rolled", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To[int32](0) })
	<-second.Done()
	waitDeployment(t, ns, "rolled", "scaled to 0", func(s appsStatus) bool { return s.Replicas == 0 && s.ReadyReplicas == 0 })

	// Delete: the runner lets go.
	if err := deps.Delete(ctx, "rolled", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
	case <-ctx.Done():
		t.Fatal("the runner still runs the deleted Deployment")
	}
	if r.Deployment(ns, "rolled") != nil {
		t.Error("the runner still lists the deleted Deployment")
	}
}
