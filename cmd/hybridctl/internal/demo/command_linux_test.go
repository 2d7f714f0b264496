package demo_test

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestDemoCommandInterrupt runs the real `hybridctl demo` binary as `make demo`
// does (KUBEBUILDER_ASSETS from the environment, binaries next to hybridctl),
// non-interactively, interrupts it, and checks that it cleans everything up:
// it exits promptly with status 0 and says so, every process it started
// (kube-apiserver, etcd, talos-ccm, ccm-coordinator, and the native CCM pods'
// containers ccm-gate and testccm) is gone, its temporary files are removed
// (it gets its own TMPDIR, which must end up empty), and it runs in a network
// namespace of its own, loopback only, that nothing is left in.
func TestDemoCommandInterrupt(t *testing.T) {
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := binaries(t)
	for _, tc := range []struct {
		name string
		// the interrupt is sent once a stdout line contains after
		after string
		// group sends SIGINT to the process group, as a terminal's Ctrl-C does
		// (talos-ccm and ccm-coordinator get it too; envtest puts
		// kube-apiserver and etcd in groups of their own); otherwise only
		// hybridctl gets it (kill -INT) and must stop every child itself.
		group bool
		// processes that must be running when the interrupt is sent
		want []string
		// kill sends SIGKILL to hybridctl instead: nothing can clean up, but
		// the controllers it started must not outlive it
		kill bool
	}{
		{name: "ctrl-c once native CCMs run", after: "running: release native-ccm-", group: true,
			want: []string{"kube-apiserver", "etcd", "talos-ccm", "ccm-coordinator", "ccm-gate", "testccm"}},
		{name: "sigint while nodes are initialized", after: "initialized: platform=", group: false,
			want: []string{"kube-apiserver", "etcd", "talos-ccm", "ccm-coordinator"}},
		{name: "sigint while starting", after: "starting talos-ccm", group: false,
			want: []string{"kube-apiserver", "etcd"}},
		{name: "sigkill once native CCMs run", after: "running: release native-ccm-", kill: true,
			want: []string{"kube-apiserver", "etcd", "talos-ccm", "ccm-coordinator", "ccm-gate", "testccm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			interruptDemo(t, bin, assets, tc.after, tc.group, tc.kill, tc.want)
		})
	}
}

func interruptDemo(t *testing.T, bin, assets, after string, group, kill bool, want []string) {
	tmp := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "hybridctl"), "demo", "--non-interactive", "--exit-when-done=false", "--timeout=5m")
	cmd.Env = append(os.Environ(), "KUBEBUILDER_ASSETS="+assets, "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its own group, like a shell job
	var out testenv.Buffer
	cmd.Stderr = &out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid

	// every process seen below hybridctl; on failure none is left behind. A
	// child first seen between fork and exec still has hybridctl's name, so
	// the name is refreshed whenever the process is seen again.
	var tracked []proc
	track := func() {
		for _, p := range descendants(pid) {
			i := slices.IndexFunc(tracked, func(q proc) bool { return q.pid == p.pid && q.start == p.start })
			if i < 0 {
				tracked = append(tracked, p)
			} else {
				tracked[i].comm = p.comm
			}
		}
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		for _, p := range tracked {
			if running(p) {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
	})

	seen := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		matched := false
		for sc.Scan() {
			_, _ = out.Write(append(sc.Bytes(), '\n'))
			if !matched && strings.Contains(sc.Text(), after) {
				matched = true
				close(seen)
			}
		}
		_, _ = io.Copy(&out, stdout)
	}()
	exited := make(chan error, 1)
	go func() { <-readDone; exited <- cmd.Wait() }()

	// wait for the progress, recording the processes as they appear
	deadline := time.After(6 * time.Minute)
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
wait:
	for {
		track()
		select {
		case <-seen:
			break wait
		case err := <-exited:
			t.Fatalf("demo exited before %q: %v\n%s", after, err, out.String())
		case <-deadline:
			t.Fatalf("no %q in the demo's output within 6m:\n%s", after, out.String())
		case <-poll.C:
		}
	}
	track()
	var names []string
	var alive []proc
	for _, p := range tracked {
		if running(p) {
			names = append(names, p.comm)
			alive = append(alive, p)
		}
	}
	for _, w := range want {
		if !slices.Contains(names, w) {
			t.Errorf("%s not running when the demo is interrupted; running: %v", w, names)
		}
	}
	// The demo proper is hybridctl's child in a network namespace of its
	// own, with loopback as its only interface.
	var inner proc
	for _, p := range alive {
		if p.comm == "hybridctl" && p.ppid == pid {
			inner = p
		}
	}
	if inner.pid == 0 {
		t.Fatalf("no hybridctl below hybridctl (the demo in its network namespace); running: %v", alive)
	}
	netns := netNamespace(inner.pid)
	if netns == "" || netns == netNamespace(os.Getpid()) {
		t.Errorf("the demo runs in network namespace %q, the test's is %q: want one of its own", netns, netNamespace(os.Getpid()))
	}
	if ifs := interfaces(inner.pid); !slices.Equal(ifs, []string{"lo"}) {
		t.Errorf("the demo's network namespace has interfaces %v, want only lo", ifs)
	}
	for _, p := range alive {
		if p.comm != "kube-apiserver" && p.comm != "etcd" && p.comm != "talos-ccm" && p.comm != "ccm-coordinator" && p.comm != "ccm-gate" && p.comm != "testccm" {
			continue
		}
		if ns := netNamespace(p.pid); ns != netns {
			t.Errorf("%s runs in network namespace %q, not the demo's %q", p, ns, netns)
		}
	}
	listening := listenersOf(inner.pid, alive)
	for who, ls := range listening {
		for _, l := range ls {
			// The one exception: ccm-gate serves its probes (only "ok") on
			// the pod IP, so the coordinator renders --health-listen=:<port>;
			// the namespace has no other interface than loopback.
			if !l.addr.IsLoopback() && !(strings.HasPrefix(who, "ccm-gate ") && l.addr.IsUnspecified()) {
				t.Errorf("%s listens on %s: not loopback", who, l)
			}
		}
	}
	if len(listening[inner.String()]) == 0 {
		t.Errorf("the demo's hybridctl listens on nothing, but the simulated Talos endpoint runs in it: %v", listening)
	}
	t.Logf("interrupting with %d processes running %v, listening on %v", len(alive), alive, listening)

	if kill {
		// The kernel stops the controllers and the pods' containers with
		// hybridctl (parent-death signal). kube-apiserver and etcd are
		// envtest's processes; the cleanup above kills them.
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-exited
		deadline := time.Now().Add(10 * time.Second)
		for _, p := range tracked {
			if !slices.Contains([]string{"hybridctl", "talos-ccm", "ccm-coordinator", "ccm-gate", "testccm"}, p.comm) {
				continue
			}
			for running(p) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if running(p) {
				t.Errorf("%s outlived hybridctl's SIGKILL by 10s", p)
			}
		}
		return
	}
	sent := time.Now()
	if group {
		err = syscall.Kill(-pid, syscall.SIGINT)
	} else {
		err = cmd.Process.Signal(syscall.SIGINT)
	}
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("demo still running 60s after SIGINT:\n%s", out.String())
	}
	took := time.Since(sent)
	t.Logf("exited %v after SIGINT", took.Round(10*time.Millisecond))
	if err != nil {
		t.Errorf("demo exited with %v after SIGINT, want status 0:\n%s", err, out.String())
	}
	text := out.String()
	if !strings.Contains(text, "demo stopped; everything it started is stopped and its temporary files are removed") {
		t.Errorf("no stopped/cleaned-up message:\n%s", text)
	}
	for _, bad := range []string{"cleanup incomplete", "killed", "hybridctl:"} {
		if strings.Contains(text, bad) {
			t.Errorf("output contains %q:\n%s", bad, text)
		}
	}

	for _, p := range tracked {
		if running(p) {
			t.Errorf("%s is still running after the demo exited", p)
		}
	}
	if left := descendants(pid); len(left) > 0 {
		t.Errorf("processes left below the demo: %v", left)
	}

	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in the demo's TMPDIR: %s", e.Name())
	}

	// its listening sockets went with its network namespace: no process is
	// left in it
	if netns != "" {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if pid, err := strconv.Atoi(e.Name()); err == nil && netNamespace(pid) == netns {
				p, _ := readProc(pid)
				t.Errorf("%s is still in the demo's network namespace", p)
			}
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
	if !strings.Contains(string(out), "needs root") || !strings.Contains(string(out), "pod runner") {
		t.Errorf("the error does not say that the demo needs root for the pod runner:\n%s", out)
	}
	// (envtest's port cache, which hybridctl links, makes its directory in
	// the cache directory when the program starts: not the demo's)
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		if e.Name() != "kubebuilder-envtest" {
			t.Errorf("the refused demo left %s in its TMPDIR", e.Name())
		}
	}
}
