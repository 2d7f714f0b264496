package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// Exec runs command in a container of a pod, through the API server and the
// node's kubelet (what `kubectl exec` does), and returns its standard output
// and error. It fails while the kubelet has no serving certificate the API
// server trusts.
func (c *Cluster) Exec(ctx context.Context, namespace, pod, container string, command ...string) (stdout, stderr string, err error) {
	req := c.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewWebSocketExecutor(c.Config, "GET", req.URL().String())
	if err != nil {
		return "", "", err
	}
	var out, errOut bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	if err != nil {
		return out.String(), errOut.String(), fmt.Errorf("exec %v in %s/%s: %w", command, namespace, pod, err)
	}
	return out.String(), errOut.String(), nil
}

// PodLogs returns a container's log through the API server and the node's
// kubelet (what `kubectl logs` does).
func (c *Cluster) PodLogs(ctx context.Context, namespace, pod, container string) (string, error) {
	b, err := c.Client.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("logs of %s/%s: %w", namespace, pod, err)
	}
	return string(b), nil
}

// Process is a container's process as the kernel sees it.
type Process struct {
	PID int
	// UID is the real user ID; CapEff the effective capability set.
	UID    int
	CapEff uint64
	// NoNewPrivs is the no_new_privs flag; ReadOnlyRoot whether / is
	// mounted read-only in its mount namespace.
	NoNewPrivs, ReadOnlyRoot bool
}

// ContainerProcesses finds the processes of a pod's running container on
// its node (by the container's cgroup) and reads what the runtime enforced.
func (c *Cluster) ContainerProcesses(pod *corev1.Pod, container string) ([]Process, error) {
	var id string
	// Sidecars (restartable init containers) are among the init containers.
	for _, cs := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if cs.Name == container {
			_, id, _ = strings.Cut(cs.ContainerID, "://")
		}
	}
	if id == "" {
		return nil, fmt.Errorf("pod %s/%s: container %s has no ID", pod.Namespace, pod.Name, container)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || !strings.Contains(string(cg), id) {
			continue
		}
		p := Process{PID: pid}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(status), "\n") {
			k, v, _ := strings.Cut(l, ":")
			f := strings.Fields(v)
			if len(f) == 0 {
				continue
			}
			switch k {
			case "Uid":
				p.UID, _ = strconv.Atoi(f[0])
			case "CapEff":
				p.CapEff, _ = strconv.ParseUint(f[0], 16, 64)
			case "NoNewPrivs":
				p.NoNewPrivs = f[0] == "1"
			}
		}
		mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(mi), "\n") {
			// id parent major:minor root mountpoint options ...
			if f := strings.Fields(l); len(f) > 5 && f[4] == "/" {
				p.ReadOnlyRoot = slices.Contains(strings.Split(f[5], ","), "ro")
			}
		}
		out = append(out, p)
	}
	return out, nil
}
