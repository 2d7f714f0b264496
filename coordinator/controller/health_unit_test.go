package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// checkMessage checks a condition message a function made: there when want
// is not nil, holding every part of want, and bounded.
func checkMessage(t *testing.T, what, got string, want []string) {
	t.Helper()
	if (got != "") != (want != nil) {
		t.Fatalf("%s = %q", what, got)
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("message %q lacks %q", got, w)
		}
	}
	if len(got) > maxLastWords+200 {
		t.Errorf("message of %d bytes", len(got))
	}
}

func TestCrashLooping(t *testing.T) {
	terminated := &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "boom: forbidden"}
	cases := []struct {
		name   string                 // case
		status corev1.ContainerStatus // the CCM container's status
		want   []string               // parts of the message; nil: not crash-looping
	}{
		{name: "running, never restarted",
			status: corev1.ContainerStatus{Name: "ccm", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}},
		{name: "restarted twice, below the threshold",
			status: corev1.ContainerStatus{Name: "ccm", RestartCount: 2, LastTerminationState: corev1.ContainerState{Terminated: terminated}}},
		{name: "restarted three times",
			status: corev1.ContainerStatus{Name: "ccm", RestartCount: 3, LastTerminationState: corev1.ContainerState{Terminated: terminated}},
			want:   []string{"container ccm of pod p restarted 3 time(s)", "last exit code 1 (Error): boom: forbidden"}},
		{name: "kubelet says CrashLoopBackOff after one restart",
			status: corev1.ContainerStatus{Name: "ccm", RestartCount: 1, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s"}}},
			want:   []string{"restarted 1 time(s)", "CrashLoopBackOff: back-off 10s"}},
		{name: "many restarts but no termination recorded (restarted by the kubelet with the pod)",
			status: corev1.ContainerStatus{Name: "ccm", RestartCount: 5}},
		{name: "a long log keeps its end",
			status: corev1.ContainerStatus{Name: "ccm", RestartCount: 3, LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 2, Message: strings.Repeat("noise\n", 400) + "the reason"}}},
			want: []string{"...", "the reason"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{c.status}}}
			checkMessage(t, "crashLooping", crashLooping([]corev1.Pod{pod}, 3), c.want)
		})
	}
}

func TestOwnPodName(t *testing.T) {
	current := corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: "hcloud-ccm-7f8c9d6b5-abcde", GenerateName: "hcloud-ccm-7f8c9d6b5-",
		Labels: map[string]string{"pod-template-hash": "7f8c9d6b5"},
	}}
	cases := []struct {
		name   string // holder's pod name
		pods   []corev1.Pod
		expect bool
	}{
		{"hcloud-ccm-7f8c9d6b5-abcde", []corev1.Pod{current}, true}, // a current pod
		{"hcloud-ccm-5c4b3a291-zyxwv", []corev1.Pod{current}, true}, // a pod of the previous ReplicaSet
		{"native-ccm-hcloud-5c4b3a291-zyxwv", nil, true},            // named after the release, no pod left
		{"someones-ccm-5d8f9", []corev1.Pod{current}, false},        // someone else
		{"", []corev1.Pod{current}, false},                          // nobody
	}
	for _, c := range cases {
		if got := ownPodName(c.name, "native-ccm-hcloud", c.pods); got != c.expect {
			t.Errorf("ownPodName(%q) = %v, want %v", c.name, got, c.expect)
		}
	}
}

// TestImagePullFailing: a container the kubelet cannot pull the image of is
// named with the kubelet's reason and words (the NoRunningPods message
// carries it); others are not.
func TestImagePullFailing(t *testing.T) {
	waiting := func(reason, msg string) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	}
	cases := []struct {
		name string                   // case
		init []corev1.ContainerStatus // the pod's init container statuses (the gate)
		main []corev1.ContainerStatus // its container statuses
		want []string                 // parts of the message; nil: none
	}{
		{name: "starting", main: []corev1.ContainerStatus{{Name: "ccm", State: waiting("ContainerCreating", "")}}},
		{name: "crash-looping is not a pull", main: []corev1.ContainerStatus{{Name: "ccm", State: waiting("CrashLoopBackOff", "back-off")}}},
		{name: "the gate's pull refused",
			init: []corev1.ContainerStatus{{Name: "ccm-gate", State: waiting("ErrImagePull", "failed to pull image \"r.example/hybrid-ccm/ccm-gate:1\": 401 Unauthorized")}},
			main: []corev1.ContainerStatus{{Name: "ccm", State: waiting("PodInitializing", "")}},
			want: []string{"container ccm-gate of pod p cannot pull its image (ErrImagePull)", "401 Unauthorized"}},
		{name: "backing off", main: []corev1.ContainerStatus{{Name: "ccm", State: waiting("ImagePullBackOff", "Back-off pulling image")}},
			want: []string{"container ccm of pod p cannot pull its image (ImagePullBackOff): Back-off pulling image"}},
		{name: "a long message keeps its end", main: []corev1.ContainerStatus{{Name: "ccm", State: waiting("ErrImagePull", strings.Repeat("x", 3000)+" the reason")}},
			want: []string{"...", "the reason"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{InitContainerStatuses: c.init, ContainerStatuses: c.main}}
			checkMessage(t, "imagePullFailing", imagePullFailing([]corev1.Pod{pod}), c.want)
		})
	}
}
