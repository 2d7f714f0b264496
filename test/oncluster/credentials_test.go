package oncluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hybrid-ccm/hybrid-ccm/charts/test/chartstest"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
)

// TestCCMHoldsNoAPICredential looks into each running native CCM container
// from the kernel's side (its process's environment, and every file of the
// volumes mounted in its mount namespace, read through /proc/<pid>/root) and
// tries each value as a bearer token against the API server at the
// in-cluster address the container's environment names, as a process there
// could: the API server must refuse every one (the view is the CCM's only
// way to the API). The same probe of the gate container must find its
// ServiceAccount token accepted: the probe can find a credential where
// there is one.
func TestCCMHoldsNoAPICredential(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	install(t)
	for _, name := range nativeCCMs {
		o := chartstest.WaitNativeCCMRunning(t, ctx, f.Config, name)
		pod, err := f.Client.CoreV1().Pods(ccmNamespace).Get(ctx, o.Status.Leader.Pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
			t.Errorf("pod %s: automountServiceAccountToken %v, want false", pod.Name, a)
		}
		ccm := pod.Spec.Containers[0].Name
		tried, accepted := tryCredentials(t, ctx, pod, ccm)
		if len(accepted) > 0 {
			t.Errorf("pod %s container %s: the API server accepts %v, bypassing the view", pod.Name, ccm, accepted)
		}
		if !slices.Contains(tried, "file "+gate.ClientTokenPath) {
			t.Errorf("pod %s container %s: the gate's client token was not among the candidates %v", pod.Name, ccm, tried)
		}
		_, gateAccepted := tryCredentials(t, ctx, pod, gate.SidecarName)
		if !slices.Contains(gateAccepted, "file "+gate.ServiceAccountTokenPath) {
			t.Errorf("pod %s container %s: its ServiceAccount token was not found or not accepted (accepted %v)", pod.Name, gate.SidecarName, gateAccepted)
		}
		t.Logf("%s: %d candidate credentials of the CCM container refused; the gate's accepted: %v", pod.Name, len(tried), gateAccepted)
	}
}

// tryCredentials collects the container's candidate credentials (every
// environment value, every small one-word file of its volumes) and sends GET
// /api/v1/nodes with each, and with none, to the in-cluster address.
func tryCredentials(t *testing.T, ctx context.Context, pod *corev1.Pod, container string) (tried, accepted []string) {
	t.Helper()
	procs, err := f.ContainerProcesses(pod, container)
	if err != nil || len(procs) == 0 {
		t.Fatalf("pod %s container %s: %v %v", pod.Name, container, procs, err)
	}
	pid := procs[0].PID
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range strings.Split(string(environ), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	host, port := env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
	if host == "" || port == "" {
		t.Fatalf("container %s has no in-cluster address in its environment", container)
	}
	candidates := map[string]string{"no credential": ""}
	for k, v := range env {
		if v != "" {
			candidates["env "+k] = v
		}
	}
	// The container's own mounts (its volumes), read from its side.
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	root := fmt.Sprintf("/proc/%d/root", pid)
	for _, l := range strings.Split(string(mi), "\n") {
		fields := strings.Fields(l)
		if len(fields) < 5 || fields[4] == "/" || strings.HasPrefix(fields[4], "/proc") || strings.HasPrefix(fields[4], "/sys") || strings.HasPrefix(fields[4], "/dev") {
			continue
		}
		mount := fields[4]
		_ = filepath.WalkDir(filepath.Join(root, mount), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			info, err := os.Stat(p)
			if err != nil || !info.Mode().IsRegular() || info.Size() == 0 || info.Size() > 64<<10 {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			if tok := strings.TrimSpace(string(b)); tok != "" && !strings.ContainsAny(tok, " \t\n") {
				candidates["file "+strings.TrimPrefix(p, root)] = tok
			}
			return nil
		})
	}
	// What a process there could do, TLS trust included; the address is
	// the Service's, reached through the node's kube-proxy.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // probing credentials, not the server
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			// The test is not in a node; the API server's own address
			// stands for the Service's.
			return (&net.Dialer{}).DialContext(ctx, network, strings.Replace(addr, net.JoinHostPort(host, port), f.Server()[len("https://"):], 1))
		},
	}}
	for what, tok := range candidates {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(host, port)+"/api/v1/nodes?limit=1", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("the in-cluster address %s:%s: %v", host, port, err)
		}
		_ = resp.Body.Close()
		tried = append(tried, what)
		if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
			accepted = append(accepted, what)
		}
	}
	slices.Sort(tried)
	slices.Sort(accepted)
	return tried, accepted
}
