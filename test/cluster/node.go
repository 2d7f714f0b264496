package cluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Node is one real node: a kubelet, containerd and kube-proxy in network,
// mount and UTS namespaces of their own (the machine), with its address on
// the cluster's bridge. Its disk (/var/lib, /var/log) survives Stop and
// Start; its /run does not, as on a reboot.
type Node struct {
	c *Cluster
	// Name is the node's name; IP its address on the bridge.
	Name string
	IP   netip.Addr

	opts   NodeOptions
	dir    string // work/nodes/<name>
	cgroup string // the kubelet's cgroupRoot, without the leading /

	mu         sync.Mutex
	holder     *proc // unshare, parent of the node's init: it keeps the namespaces
	init       int   // the node's init (PID 1 inside)
	containerd *proc
	kubelet    *proc
	kubeProxy  *proc
	services   []*service
	boots      int
}

// service is a TCP server a test runs on the node's address (its Talos API):
// listened again in the node's network namespace after every boot, closed at
// power-off.
type service struct {
	port  int
	serve func(net.Listener)
	lis   net.Listener
}

func (c *Cluster) newNode(o NodeOptions, ip netip.Addr) (*Node, error) {
	if o.Name == "" || strings.ContainsAny(o.Name, "/ \t\n") {
		return nil, fmt.Errorf("bad node name %q", o.Name)
	}
	n := &Node{c: c, Name: o.Name, IP: ip, opts: o, dir: filepath.Join(c.work, "nodes", o.Name),
		cgroup: fmt.Sprintf("hybrid-ccm-%d-%s", os.Getpid(), o.Name)}
	for _, d := range []string{"var-lib", "var-log", "run", "cgroup"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	c.stateMu.Lock()
	c.state.Cgroups = append(c.state.Cgroups, n.cgroup)
	err := c.state.save()
	c.stateMu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := makeCgroup(n.cgroup); err != nil {
		return nil, err
	}
	if err := n.writeConfigs(); err != nil {
		return nil, err
	}
	return n, nil
}

// nsenter is the prefix that runs a command inside the node whose init is
// pid: its network, mount and UTS namespaces.
func (n *Node) nsenter(pid int) []string {
	return []string{"nsenter", "--target", strconv.Itoa(pid), "--net", "--mount", "--uts", "--"}
}

// daemon is the prefix that runs a daemon inside the node: in its PID
// namespace too (nsenter forks it there), so that what it leaves behind is
// reaped by the node's init and dies with the node.
func (n *Node) daemon() []string {
	return []string{"nsenter", "--target", strconv.Itoa(n.init), "--net", "--mount", "--uts", "--pid", "--"}
}

// Exec runs a command inside the node (its namespaces) and returns its
// combined output.
func (n *Node) Exec(argv ...string) (string, error) {
	n.mu.Lock()
	h, pid := n.holder, n.init
	n.mu.Unlock()
	if h == nil {
		return "", fmt.Errorf("node %s is off", n.Name)
	}
	full := append(n.nsenter(pid), argv...)
	out, err := execOutput(full...)
	return out, err
}

// boot makes the machine: namespaces, its interface on the bridge, its own
// sysfs, and its disk and /run mounted in place.
func (n *Node) boot() error {
	// A fresh /run, as after a reboot.
	runDir := filepath.Join(n.dir, "run")
	if err := os.RemoveAll(runDir); err != nil {
		return err
	}
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// The machine's namespaces; its PID 1 is this program (nodeInit): when
	// it dies, the kernel kills every process of the node, containers
	// included, and unshare kills it when it dies itself (which the
	// parent-death signal makes it do with the cluster's process).
	h, err := n.c.start(n.Name+"-machine", []string{"unshare", "--net", "--mount", "--uts", "--pid", "--fork", "--kill-child=SIGKILL",
		"--mount-proc", "--propagation", "private", "--", self}, []string{initMarker + "=1"})
	if err != nil {
		return err
	}
	own, _ := mountNamespace(os.Getpid())
	var initPID int
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		if done, err := h.exited(); done {
			return false, fmt.Errorf("unshare exited: %v", err)
		}
		children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", h.pid(), h.pid()))
		f := strings.Fields(string(children))
		if len(f) != 1 {
			return false, nil
		}
		initPID, _ = strconv.Atoi(f[0])
		ns, _ := mountNamespace(initPID)
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", initPID))
		return exe == self && ns != "" && ns != own, nil
	}); err != nil {
		h.kill()
		return fmt.Errorf("namespaces: %w", err)
	}
	// The node's init, by PID and start time: Recover kills it (and with it
	// the whole node) if this process dies first. Namespace inodes are not
	// a key: the kernel reuses them.
	initStart, err := procStart(initPID)
	if err != nil {
		h.kill()
		return err
	}
	n.c.stateMu.Lock()
	n.c.state.Processes = append(n.c.state.Processes, process{PID: initPID, Start: initStart})
	err = n.c.state.save()
	n.c.stateMu.Unlock()
	if err != nil {
		h.kill()
		return err
	}
	n.mu.Lock()
	n.holder, n.init = h, initPID
	n.boots++
	n.mu.Unlock()

	veth := "v-" + n.Name
	if len(veth) > 15 {
		veth = veth[:15]
	}
	pid := strconv.Itoa(initPID)
	in := n.nsenter(initPID)
	gw := Gateway.String()
	// The previous boot's interface outlives its namespace while anything
	// still holds that namespace (a connection to one of its services).
	_ = run("ip", "link", "del", veth)
	steps := [][]string{
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pid},
		{"ip", "link", "set", veth, "master", bridgeName, "up"},
		append(in, "ip", "link", "set", "lo", "up"),
		append(in, "ip", "addr", "add", fmt.Sprintf("%s/%d", n.IP, bridgePrefix.Bits()), "dev", "eth0"),
		append(in, "ip", "link", "set", "eth0", "up"),
		append(in, "ip", "route", "add", "default", "via", gw),
		append(in, "hostname", n.Name),
		// The node's own sysfs (its network devices), with the host's cgroup
		// tree moved back on top of it.
		append(in, "mount", "--rbind", "/sys/fs/cgroup", filepath.Join(n.dir, "cgroup")),
		append(in, "mount", "-t", "sysfs", "sysfs", "/sys"),
		append(in, "mount", "--move", filepath.Join(n.dir, "cgroup"), "/sys/fs/cgroup"),
		// Its disk and its /run.
		append(in, "mount", "--bind", filepath.Join(n.dir, "var-lib"), "/var/lib"),
		append(in, "mount", "--bind", filepath.Join(n.dir, "var-log"), "/var/log"),
		append(in, "mount", "--bind", runDir, "/run"),
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return err
		}
	}
	return nil
}

// Start boots the machine if it is off, then starts containerd, the kubelet
// and kube-proxy, and the node's services (ServeTCP).
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	off := n.holder == nil
	n.mu.Unlock()
	if off {
		if err := n.boot(); err != nil {
			return fmt.Errorf("boot: %w", err)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	in := n.daemon()
	var err error
	if n.containerd == nil {
		if n.containerd, err = n.c.start(n.Name+"-containerd", append(in, "containerd", "--config", filepath.Join(n.dir, "containerd.toml")), nil); err != nil {
			return err
		}
		sock := filepath.Join(n.dir, "run", "containerd", "containerd.sock")
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			if done, err := n.containerd.exited(); done {
				return false, fmt.Errorf("containerd exited: %v", err)
			}
			_, err := os.Stat(sock)
			return err == nil, nil
		}); err != nil {
			return fmt.Errorf("containerd: %w", err)
		}
	}
	if n.kubelet == nil {
		if n.kubelet, err = n.c.start(n.Name+"-kubelet", append(in, filepath.Join(n.c.opts.ClusterBinaries, "kubelet"),
			"--config="+filepath.Join(n.dir, "kubelet.yaml"),
			"--kubeconfig="+n.c.pki.path("kubelet-"+n.Name+".kubeconfig"),
			"--node-ip="+n.IP.String(),
			"--hostname-override="+n.Name,
			"--cloud-provider=external",
			"--register-with-taints="+n.taints(),
			"--v=2",
		), nil); err != nil {
			return err
		}
	}
	if n.kubeProxy == nil {
		if n.kubeProxy, err = n.c.start(n.Name+"-kube-proxy", append(in, filepath.Join(n.c.opts.ClusterBinaries, "kube-proxy"),
			"--config="+filepath.Join(n.dir, "kube-proxy.yaml"),
		), nil); err != nil {
			return err
		}
	}
	for _, s := range n.services {
		if s.lis == nil {
			if err := n.listen(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// Stop powers the machine off: every process in it is killed (containers
// too), its services stop answering and its namespaces are gone. Start boots
// it again with the same disk.
func (n *Node) Stop() {
	n.stopDaemons(0)
	n.mu.Lock()
	h, init := n.holder, n.init
	n.holder, n.init = nil, 0
	for _, s := range n.services {
		if s.lis != nil {
			s.lis.Close()
			s.lis = nil
		}
	}
	n.mu.Unlock()
	if h == nil {
		return
	}
	h.kill() // and the kernel kills init, and with it the node
	_ = wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", init))
		return err != nil, nil
	})
}

// Reboot is Stop then Start.
func (n *Node) Reboot(ctx context.Context) error {
	n.Stop()
	return n.Start(ctx)
}

// Boots counts how often the machine was booted.
func (n *Node) Boots() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.boots
}

// StopKubelet stops the node's kubelet, kube-proxy and containerd (grace
// 0: SIGKILL) and leaves the machine and its containers running.
func (n *Node) StopKubelet(grace time.Duration) { n.stopDaemons(grace) }

// stopDaemons stops kube-proxy, the kubelet and containerd (grace 0:
// SIGKILL, a power cut).
func (n *Node) stopDaemons(grace time.Duration) {
	n.mu.Lock()
	ps := []*proc{n.kubeProxy, n.kubelet, n.containerd}
	n.kubeProxy, n.kubelet, n.containerd = nil, nil, nil
	n.mu.Unlock()
	for _, p := range ps {
		if grace == 0 {
			p.kill()
		} else {
			p.stop(grace)
		}
	}
}

// ServeTCP runs serve on a listener at the node's address and port, in the
// node's network namespace, now if the node is up and after every boot; the
// listener is closed when the node powers off.
func (n *Node) ServeTCP(port int, serve func(net.Listener)) error {
	s := &service{port: port, serve: serve}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.services = append(n.services, s)
	if n.holder == nil {
		return nil
	}
	return n.listen(s)
}

// listen opens s's listener inside the node's network namespace (a socket
// stays in the namespace it was made in). Called with n.mu held.
func (n *Node) listen(s *service) error {
	lis, err := listenIn(fmt.Sprintf("/proc/%d/ns/net", n.init), net.JoinHostPort(n.IP.String(), strconv.Itoa(s.port)))
	if err != nil {
		return fmt.Errorf("node %s: listen on port %d: %w", n.Name, s.port, err)
	}
	s.lis = lis
	go s.serve(lis)
	return nil
}

// listenIn listens on addr inside the network namespace at nsPath.
func listenIn(nsPath, addr string) (net.Listener, error) {
	type result struct {
		lis net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// This goroutine's thread changes namespace and is never given back
		// to the scheduler (no UnlockOSThread): the runtime ends the thread.
		runtime.LockOSThread()
		target, err := os.Open(nsPath)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns %s: %w", nsPath, err)}
			return
		}
		lis, err := net.Listen("tcp", addr)
		ch <- result{lis, err}
	}()
	r := <-ch
	return r.lis, r.err
}

// taints are what the kubelet registers the node with (besides the
// uninitialized taint, which --cloud-provider=external adds).
func (n *Node) taints() string {
	if n.opts.ControlPlane {
		return controlPlaneLabel + ":NoSchedule"
	}
	return ""
}

const controlPlaneLabel = "node-role.kubernetes.io/control-plane"

// waitRegistered waits for the node's Node object, and labels a
// control-plane node as Talos does.
func (n *Node) waitRegistered(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n.mu.Lock()
		k := n.kubelet
		n.mu.Unlock()
		if k != nil {
			if done, err := k.exited(); done {
				return false, fmt.Errorf("kubelet exited: %v (log: %s)", err, filepath.Join(n.c.logDir(), n.Name+"-kubelet.log"))
			}
		}
		o, err := n.c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if !n.opts.ControlPlane {
			return true, nil
		}
		if _, ok := o.Labels[controlPlaneLabel]; ok {
			return true, nil
		}
		patch := []byte(`{"metadata":{"labels":{"` + controlPlaneLabel + `":""}}}`)
		_, err = n.c.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		return err == nil, nil
	})
}

func execOutput(argv ...string) (string, error) {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%q: %w", argv, err)
	}
	return string(out), nil
}

// Kubeconfig is the node's kubelet credential (system:node:<name>), for a
// test that writes as that kubelet.
func (n *Node) Kubeconfig() string { return n.c.pki.path("kubelet-" + n.Name + ".kubeconfig") }

// VarLib is where the node's /var/lib is on the host (its disk: it survives
// Stop and Start).
func (n *Node) VarLib() string { return filepath.Join(n.dir, "var-lib") }
