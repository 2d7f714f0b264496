package demo_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/cluster"
)

// kubectlHint is the line that says how to point kubectl at the cluster.
var kubectlHint = regexp.MustCompile(`^\s+(nsenter --net=/proc/(\d+)/ns/net kubectl --kubeconfig=(\S+)) get nodes,nativeccms$`)

// TestDemoCommandInterrupt runs the real `hybridctl demo` binary as `make
// demo` does, non-interactively, interrupts it, and checks that nothing it
// started is left: every process (the control plane, the kubelets,
// containerd and the containers, kube-proxy) is gone, its temporary files
// are removed (it gets its own TMPDIR, which must end up empty), the host is
// as the cluster found it, and nothing is left in its network namespace.
func TestDemoCommandInterrupt(t *testing.T) {
	// Ctrl-C on a terminal (SIGINT to the process group) once the native
	// CCMs run: the demo stops everything in order, says so and exits 0.
	// Before, the kubectl command it printed works.
	t.Run("ctrl-c once native CCMs run", func(t *testing.T) {
		r := startDemo(t, "--non-interactive", "--exit-when-done=false", "--timeout=8m")
		hint := r.waitFor(t, kubectlHint, 15*time.Minute)
		inner, _ := strconv.Atoi(hint[2])
		// the hcloud and an aws native CCM (in either order), so that every
		// kind of process checkNothingLeft asks for has run: the first alone
		// may be AWS's, before the hcloud testccm has started (the aws ones
		// are one per region: native-ccm-aws-<region>)
		running := regexp.MustCompile(`running: release native-ccm-(hcloud|aws)(?:-[a-z0-9-]+)? rev `)
		for up := map[string]bool{}; len(up) < 2; {
			up[r.waitFor(t, running, 15*time.Minute)[1]] = true
		}
		checkKubectl(t, hint[1])
		netns := checkNetns(t, r, inner)

		sent := time.Now()
		if err := syscall.Kill(-r.pid, syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		err := r.wait(t, 3*time.Minute)
		t.Logf("exited %v after SIGINT", time.Since(sent).Round(10*time.Millisecond))
		if err != nil {
			t.Errorf("demo exited with %v after SIGINT, want status 0:\n%s", err, r.out.String())
		}
		text := r.out.String()
		if !strings.Contains(text, "demo stopped; everything it started is stopped, the host is as before and its temporary files are removed") {
			t.Errorf("no stopped/cleaned-up message:\n%s", text)
		}
		for _, bad := range []string{"cleanup incomplete", "hybridctl:", "taking the cluster down\n"} {
			if strings.Contains(text, bad) {
				t.Errorf("output contains %q:\n%s", bad, text)
			}
		}
		r.checkNothingLeft(t, append(clusterProcesses, "containerd-shim", "ccm-gate", "aws-cloud-contr", "testccm", "talos-ccm", "ccm-coordinator")...)
		checkHostRestored(t, inner)
		checkNetnsEmpty(t, netns)
	})

	// SIGINT while the cluster comes up: test/cluster's own handler takes
	// the cluster down and exits (status 130), or the demo does (0);
	// either way nothing is left, and the first hybridctl removes the
	// demo's temporary files.
	t.Run("sigint while the cluster starts", func(t *testing.T) {
		r := startDemo(t, "--non-interactive")
		// the first node is up once the second starts
		r.waitFor(t, regexp.MustCompile(`cluster: node web-metal1`), 15*time.Minute)
		inner := innerDemo(t, r)
		if err := syscall.Kill(-r.pid, syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		err := r.wait(t, 3*time.Minute)
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 130) {
			t.Errorf("demo exited with %v after SIGINT, want status 0 or 130:\n%s", err, r.out.String())
		}
		t.Logf("exited with %v; output:\n%s", err, r.out.String())
		r.checkNothingLeft(t, "etcd", "kube-apiserver", "kubelet", "containerd")
		checkHostRestored(t, inner)
	})

	// SIGKILL of the demo once its cluster is up: nothing can clean up in
	// it, but every process it started dies with it (parent-death signals),
	// the first hybridctl removes its temporary files, and the next cluster
	// (Recover) restores the host.
	t.Run("sigkill once the cluster is up", func(t *testing.T) {
		r := startDemo(t, "--non-interactive")
		hint := r.waitFor(t, kubectlHint, 15*time.Minute)
		inner, _ := strconv.Atoi(hint[2])
		if err := syscall.Kill(inner, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err := r.wait(t, time.Minute)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 128+int(syscall.SIGKILL) {
			t.Errorf("hybridctl exited with %v when its demo was killed, want status 137", err)
		}
		r.checkNothingLeft(t, clusterProcesses...)
		if err := cluster.Recover(); err != nil {
			t.Errorf("Recover after the killed demo: %v", err)
		}
		checkHostRestored(t, inner)
	})
}

// innerDemo is the demo proper: hybridctl's child in a network namespace of
// its own.
func innerDemo(t *testing.T, r *demoRun) int {
	t.Helper()
	r.track()
	for _, p := range r.tracked {
		if p.comm == "hybridctl" && p.ppid == r.pid && running(p) {
			return p.pid
		}
	}
	t.Fatalf("no hybridctl below hybridctl (the demo in its network namespace); running: %v", r.tracked)
	return 0
}

// checkNetns checks that the demo runs in a network namespace of its own,
// with loopback, the cluster's bridge and the nodes' links as its only
// interfaces, and returns it.
func checkNetns(t *testing.T, r *demoRun, inner int) string {
	t.Helper()
	if got := innerDemo(t, r); got != inner {
		t.Errorf("the kubectl command names process %d, the demo is %d", inner, got)
	}
	ns := netNamespace(inner)
	if ns == "" || ns == netNamespace(os.Getpid()) {
		t.Errorf("the demo runs in network namespace %q, the test's is %q: want one of its own", ns, netNamespace(os.Getpid()))
	}
	for _, i := range interfaces(inner) {
		if i != "lo" && i != "hccm0" && !strings.HasPrefix(i, "v-") {
			t.Errorf("the demo's network namespace has interface %s: want lo, the cluster's bridge and the nodes' links only", i)
		}
	}
	return ns
}

// checkKubectl runs the printed command (as the demo says, in its network
// namespace) and expects every node.
func checkKubectl(t *testing.T, command string) {
	t.Helper()
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Logf("no kubectl on this machine: the printed command %q is not tried", command)
		return
	}
	args := append(strings.Fields(command), "get", "nodes", "-o", "name")
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, n := range []string{"cp-metal1", "aws-web-1", "hcloud-app-2", "gcp-batch-1", "db-metal1"} {
		if !strings.Contains(string(out), "node/"+n+"\n") {
			t.Errorf("%s: no node %s:\n%s", strings.Join(args, " "), n, out)
		}
	}
}

// checkHostRestored checks what the demo's cluster (made by process inner)
// changed on the host is undone: its state file and its nodes' cgroups
// are gone.
func checkHostRestored(t *testing.T, inner int) {
	t.Helper()
	if _, err := os.Stat(filepath.Join("/run/hybrid-ccm/clusters", strconv.Itoa(inner)+".json")); err == nil {
		t.Errorf("the demo's cluster state file is left: its host changes were not undone")
	}
	cgroups, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/hybrid-ccm-%d-*", inner))
	if len(cgroups) > 0 {
		t.Errorf("the demo's nodes' cgroups are left: %v", cgroups)
	}
	works, _ := filepath.Glob("/tmp/hybrid-ccm-cluster-*")
	for _, w := range works {
		// another package's cluster may run meanwhile: only a work
		// directory no live cluster owns is a leftover
		if !ownedByLiveCluster(w) {
			t.Errorf("cluster work directory left: %s", w)
		}
	}
}

// ownedByLiveCluster reports whether a cluster state file names work as its
// work directory.
func ownedByLiveCluster(work string) bool {
	files, _ := filepath.Glob("/run/hybrid-ccm/clusters/*.json")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), strconv.Quote(work)) {
			return true
		}
	}
	return false
}

// checkNetnsEmpty: no process is left in the demo's network namespace.
func checkNetnsEmpty(t *testing.T, ns string) {
	t.Helper()
	if ns == "" {
		return
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && netNamespace(pid) == ns {
			p, _ := readProc(pid)
			t.Errorf("%s is still in the demo's network namespace", p)
		}
	}
}

// TestDemoCommandNeedsRoot runs `hybridctl demo` as an unprivileged user: it
// must refuse at once, saying that it needs root and why, and start nothing.
func TestDemoCommandNeedsRoot(t *testing.T) {
	bin := binaries(t)
	if err := os.Chmod(bin, 0o755); err != nil { // the user must reach hybridctl
		t.Fatal(err)
	}
	// t.TempDir's parent is private to root
	tmp, err := os.MkdirTemp("", "hybrid-ccm-demo-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "hybridctl"), "demo", "--non-interactive")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "HOME="+tmp, "XDG_CACHE_HOME="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("hybridctl demo as uid 65534: %v, want exit status 1:\n%s", err, out)
	}
	if !strings.Contains(string(out), "needs root") || !strings.Contains(string(out), "real cluster") {
		t.Errorf("the error does not say that the demo needs root for its real cluster:\n%s", out)
	}
	// (envtest's port cache, which hybridctl links, makes its directory in
	// the cache directory when the program starts: not the demo's)
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		if !slices.Contains([]string{"kubebuilder-envtest"}, e.Name()) {
			t.Errorf("the refused demo left %s in its TMPDIR", e.Name())
		}
	}
}
