package demo_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/testbin"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var (
	binDir   string
	buildErr error
	build    sync.Once
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hybrid-ccm-demo-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// binaries builds hybridctl once, and the upstream AWS CCM and CoreDNS the
// demo runs into their caches (hack/aws-ccm.sh, hack/coredns.sh, as `make
// demo` does; no-ops once built).
func binaries(t *testing.T) string {
	t.Helper()
	build.Do(func() {
		// The run's build (test/testbin), or built into binDir.
		if binDir, buildErr = testbin.DevDirectory(binDir, "hybridctl"); buildErr != nil {
			return
		}
		for _, script := range []string{"aws-ccm.sh", "coredns.sh"} {
			cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", script))
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("hack/%s: %v\n%s", script, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// clusterEnv is what `make demo` gives hybridctl: the control plane's and
// the cluster's binaries.
func clusterEnv(t *testing.T) []string {
	t.Helper()
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	nodes := os.Getenv("HYBRID_CCM_CLUSTER_BINARIES")
	if nodes == "" {
		t.Fatal("HYBRID_CCM_CLUSTER_BINARIES is not set: run `make test`, or export HYBRID_CCM_CLUSTER_BINARIES=$(hack/cluster-binaries.sh)")
	}
	return []string{"KUBEBUILDER_ASSETS=" + assets, "HYBRID_CCM_CLUSTER_BINARIES=" + nodes}
}

// demoRun is `hybridctl demo` started as `make demo` starts it, with a
// TMPDIR of its own, its output read line by line.
type demoRun struct {
	cmd *exec.Cmd
	pid int
	tmp string
	out testenv.Buffer
	// lines receives the stdout lines (buffered; dropped when full)
	lines  chan string
	exited chan error
	// tracked are the processes seen below hybridctl so far
	tracked []proc
}

// startDemo starts the demo with args; group puts it in a process group of
// its own, like a shell job.
func startDemo(t *testing.T, args ...string) *demoRun {
	t.Helper()
	bin := binaries(t)
	r := &demoRun{tmp: filepath.Join(t.TempDir(), "tmp"), lines: make(chan string, 100000), exited: make(chan error, 1)}
	if err := os.Mkdir(r.tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	r.cmd = exec.Command(filepath.Join(bin, "hybridctl"), append([]string{"demo"}, args...)...)
	r.cmd.Env = append(append(os.Environ(), clusterEnv(t)...), "TMPDIR="+r.tmp)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.cmd.Stderr = &r.out
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.pid = r.cmd.Process.Pid
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			_, _ = r.out.Write(append(sc.Bytes(), '\n'))
			select {
			case r.lines <- sc.Text():
			default: // nobody reads them
			}
		}
		_, _ = io.Copy(&r.out, stdout)
	}()
	go func() { <-readDone; r.exited <- r.cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-r.pid, syscall.SIGKILL)
		for _, p := range r.tracked {
			if running(p) {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
			}
		}
	})
	return r
}

// track records the processes below hybridctl. A child first seen between
// fork and exec still has hybridctl's name, so the name is refreshed
// whenever the process is seen again.
func (r *demoRun) track() {
	for _, p := range descendants(r.pid) {
		i := slices.IndexFunc(r.tracked, func(q proc) bool { return q.pid == p.pid && q.start == p.start })
		if i < 0 {
			r.tracked = append(r.tracked, p)
		} else {
			r.tracked[i].comm = p.comm
		}
	}
}

// waitFor waits for a stdout line matching re, tracking processes; it
// returns the line's submatches.
func (r *demoRun) waitFor(t *testing.T, re *regexp.Regexp, within time.Duration) []string {
	t.Helper()
	deadline := time.After(within)
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		r.track()
		select {
		case l := <-r.lines:
			if m := re.FindStringSubmatch(l); m != nil {
				r.track()
				return m
			}
		case err := <-r.exited:
			r.exited <- err
			t.Fatalf("demo exited before a line matching %q: %v\n%s", re, err, r.out.String())
		case <-deadline:
			t.Fatalf("no line matching %q in the demo's output within %s:\n%s", re, within, r.out.String())
		case <-poll.C:
		}
	}
}

// wait waits for the demo to exit, tracking processes.
func (r *demoRun) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	deadline := time.After(within)
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		r.track()
		select {
		case err := <-r.exited:
			return err
		case <-deadline:
			t.Fatalf("demo still running after %s:\n%s", within, r.out.String())
		case <-poll.C:
		}
	}
}

// checkNothingLeft checks that every process the demo started is gone and
// its TMPDIR is empty; seen are processes that must have been seen running
// (or the check could not fail).
func (r *demoRun) checkNothingLeft(t *testing.T, seen ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range r.tracked {
		for running(p) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if running(p) {
			t.Errorf("%s is still running after the demo exited", p)
		}
	}
	if left := descendants(r.pid); len(left) > 0 {
		t.Errorf("processes left below the demo: %v", left)
	}
	entries, err := os.ReadDir(r.tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in the demo's TMPDIR: %s", e.Name())
	}
	var names []string
	for _, p := range r.tracked {
		names = append(names, p.comm)
	}
	slices.Sort(names)
	for _, want := range seen {
		if !slices.Contains(names, want) {
			t.Errorf("no %s was seen below the demo (seen: %v): the check could not fail", want, slices.Compact(names))
		}
	}
}

// clusterProcesses are processes of the cluster that run once it is up.
var clusterProcesses = []string{"etcd", "kube-apiserver", "kube-controller", "kube-scheduler", "kubelet", "containerd", "kube-proxy"}

// TestDemoReachesEndState runs the demo non-interactively, as `make demo` does
// without a terminal, and checks its end state (the demo itself fails unless
// it is exactly as expected): every real node initialized by talos-ccm (a
// pod, installed from docs/deploy) with a pod CIDR, every kubelet's serving
// CSR approved and the forged one denied, every native CCM running in a pod
// that holds its lease, gated, the aws ones one per region, each owning its
// region's nodes; the fence denying the hcloud CCM an aws node and the first
// aws region's CCM the other region's node; after the outage, in which the machines power
// off, the gone hcloud server's node deleted by the hcloud CCM, the
// terminated aws instance's node deleted and the stopped one's tainted by
// the first region's upstream AWS CCM, the powered-off metal node and the other hcloud node
// untouched, and no cloud asked about another's node. Then nothing it
// started runs any more and its temporary files are gone.
func TestDemoReachesEndState(t *testing.T) {
	r := startDemo(t, "--timeout=8m")
	err := r.wait(t, 20*time.Minute)
	out := r.out.String()
	if err != nil {
		t.Fatalf("hybridctl demo: %v\n%s", err, out)
	}
	t.Logf("demo output:\n%s", out)
	r.checkNothingLeft(t, clusterProcesses...)
	for _, want := range []string{
		"make release into the registry as ghcr.io/hybrid-ccm", "applying docs/deploy/talos-ccm.yaml", "applying docs/deploy/ccm-coordinator.yaml",
		"nsenter --net=/proc/", "kubectl --kubeconfig=",
		"node/hcloud-app-1", "providerID=hcloud://5101",
		"node/web-metal1", "providerID=talos://metal/10.99.0.",
		"csr/" + "forged-by-aws-web-1", "Denied", "filed by system:node:aws-web-1",
		"nativeccm/hcloud", "running: release native-ccm-hcloud rev ", "lease held by pod native-ccm-hcloud-",
		"gate/delete node/aws-web-1", "denied: ", "hybrid-ccm gate",
		"gate/delete node/hcloud-app-1 (dry run)", "allowed",
		"the aws CCM is the upstream one: ", "aws-cloud-controller-manager",
		"nativeccm/aws-eu-central-1", "running: release native-ccm-aws-eu-central-1 rev ", "lease held by pod native-ccm-aws-eu-central-1-",
		"nativeccm/aws-us-east-1", "running: release native-ccm-aws-us-east-1 rev ", "lease held by pod native-ccm-aws-us-east-1-",
		"1 node(s) of its domain (aws, topology.kubernetes.io/region=us-east-1)", "of its domain (aws, topology.kubernetes.io/region=eu-central-1)",
		"node/aws-api-1", "providerID=aws:///us-east-1a/i-0b21",
		"gate/delete node/aws-api-1", "outside the domain of NativeCCM aws-eu-central-1",
		"cloud/hcloud/hcloud-app-2", "cloud/aws/aws-web-1", "cloud/aws/aws-web-2",
		"podCIDRs=10.244.", "NotReady (kubelet silent), tainted shutdown",
		"10/10 nodes initialized, 10/10 kubelet serving certificates approved, 1 CSR denied, 4/4 native CCMs installed, running and gated; " +
			"outage: hcloud-app-2 deleted by the hcloud CCM, aws-web-1 deleted and aws-web-2 tainted shutdown by the aws-eu-central-1 CCM, db-metal1 left alone",
		"demo finished; everything it started is stopped, the host is as before and its temporary files are removed",
		"service/shop/web-aws", "from the aws cloud's load balancer, targets aws-web-2",
		"service/shop/web-hcloud", "from the hcloud cloud's load balancer, targets hcloud-app-1",
		"4/4 LoadBalancer Services have an address from their cloud",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	for _, bad := range []string{"NOT ITS OWN", "not as expected", "cleanup incomplete"} {
		if strings.Contains(out, bad) {
			t.Errorf("demo output has %q", bad)
		}
	}
	if !regexp.MustCompile(`(?m)node/hcloud-app-2 +deleted`).MatchString(out) {
		t.Errorf("demo output does not show node hcloud-app-2 deleted")
	}
	// the upstream AWS CCM deleted its terminated instance's node (its event)
	if !regexp.MustCompile(`(?m)node/aws-web-1 +deleted — aws-cloud-controller-manager `).MatchString(out) {
		t.Errorf("demo output does not show node aws-web-1 deleted by the AWS CCM")
	}
	// no other node was deleted: the NotReady metal node and hcloud-app-1 stay
	for _, m := range regexp.MustCompile(`(?m)node/(\S+) +deleted`).FindAllStringSubmatch(out, -1) {
		if m[1] != "hcloud-app-2" && m[1] != "aws-web-1" {
			t.Errorf("node %s was deleted", m[1])
		}
	}
	// each cloud was asked about its own nodes only
	own := map[string]string{"hcloud": "hcloud-", "gce": "gcp-", "aws": "aws-"}
	for _, m := range regexp.MustCompile(`\] cloud/([^/\s]+)/(\S+)`).FindAllStringSubmatch(out, -1) {
		if !strings.HasPrefix(m[2], own[m[1]]) || own[m[1]] == "" {
			t.Errorf("cloud/%s/%s: a cloud was asked about a node that is not its own", m[1], m[2])
		}
	}
}
