package podrunner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/hybrid-ccm/hybrid-ccm/test/podrunner"
)

// report is what testpod printed (see internal/testpod).
type report struct {
	Name     string            `json:"name"`
	Args     []string          `json:"args"`
	UID      int               `json:"uid"`
	GID      int               `json:"gid"`
	Groups   []int             `json:"groups"`
	Cwd      string            `json:"cwd"`
	Hostname string            `json:"hostname"`
	Env      map[string]string `json:"env"`
	Files    map[string]string `json:"files"`
	Writable map[string]string `json:"writable"`
	User     string            `json:"user"`
	PodName  string            `json:"podName"`
	APIError string            `json:"apiError"`
	Order    string            `json:"order"`
}

const wait = 60 * time.Second

func newRunner(t *testing.T) *podrunner.Runner {
	t.Helper()
	images, err := podrunner.LayoutImages(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	images.Map(mappedImage, binary)
	return podrunner.New(t, podrunner.Options{
		Config:         env.Config,
		Images:         images,
		NodeName:       "podrunner-test-node",
		MaxProbePeriod: 200 * time.Millisecond,
		MaxGracePeriod: 2 * time.Second,
	})
}

func namespace(t *testing.T) string {
	t.Helper()
	ns := "pr-" + rand.String(6)
	_, err := env.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

func create(t *testing.T, obj any) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch o := obj.(type) {
	case *corev1.Secret:
		_, err = env.Client.CoreV1().Secrets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.ConfigMap:
		_, err = env.Client.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.ServiceAccount:
		_, err = env.Client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *appsv1.Deployment:
		_, err = env.Client.AppsV1().Deployments(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	default:
		t.Fatalf("create %T", obj)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func deployment(ns, name string, spec corev1.PodSpec) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"test": "podrunner"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"note": "from-template"}}, Spec: spec},
		},
	}
}

// reportOf waits for the container's REPORT line (of its latest run).
func reportOf(t *testing.T, p *podrunner.Pod, container string) report {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		logs := p.Logs(container)
		if i := strings.LastIndex(logs, "REPORT "); i >= 0 {
			line, _, _ := strings.Cut(logs[i+len("REPORT "):], "\n")
			var r report
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("%s: report %q: %v", container, line, err)
			}
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s printed no report; logs:\n%s", container, p.Logs(container))
	return report{}
}

// podObject waits until the Pod object satisfies cond and returns it.
func podObject(t *testing.T, p *podrunner.Pod, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(wait)
	var last *corev1.Pod
	for time.Now().Before(deadline) {
		pod, err := env.Client.CoreV1().Pods(p.Namespace()).Get(context.Background(), p.Name(), metav1.GetOptions{})
		if err == nil {
			last = pod
			if cond(pod) {
				return pod
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := json.MarshalIndent(last, "", "  ")
	t.Fatalf("pod %s/%s: %s did not happen; last seen:\n%s", p.Namespace(), p.Name(), what, b)
	return nil
}

func condition(pod *corev1.Pod, typ corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range pod.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

func containerStatus(pod *corev1.Pod, name string) corev1.ContainerStatus {
	for _, s := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		if s.Name == name {
			return s
		}
	}
	return corev1.ContainerStatus{}
}

func httpProbe(path string, port int) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(port)}}, PeriodSeconds: 1, FailureThreshold: 2}
}

var nextPort = 23100

// port is a loopback port for one test's program (tests in this package do
// not run in parallel).
func port() int {
	nextPort++
	return nextPort
}

func setProbe(t *testing.T, port int, query string) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/set?%s", port, query))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

func strconvItoa(i int) string { return fmt.Sprint(i) }

type appsStatus = appsv1.DeploymentStatus

func waitDeployment(t *testing.T, ns, name, what string, cond func(appsStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	var last appsStatus
	for time.Now().Before(deadline) {
		d, err := env.Client.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			last = d.Status
			if cond(d.Status) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("deployment %s/%s: %s did not happen; status %+v", ns, name, what, last)
}

// updateDeployment changes a Deployment whose status the runner writes
// concurrently.
func updateDeployment(t *testing.T, ns, name string, change func(*appsv1.Deployment)) *appsv1.Deployment {
	t.Helper()
	var out *appsv1.Deployment
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := env.Client.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(d)
		out, err = env.Client.AppsV1().Deployments(ns).Update(context.Background(), d, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
