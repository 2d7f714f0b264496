package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// stateDir holds one file per running cluster: what it changed on the host,
// so that the next Up undoes it if the cluster's process was killed before it
// could (SIGKILL, an OOM kill, a CI timeout).
const stateDir = "/run/hybrid-ccm/clusters"

// sysctls are the global (not per network namespace) kernel settings a
// kubelet changes at start (its kernel tunables); they are recorded before
// the first kubelet starts and written back at Down.
var sysctls = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// hostState is what a cluster changed on the host and how to undo it. Network
// changes are not in it: every interface, route and iptables rule lives in a
// network namespace that disappears with the cluster's processes.
type hostState struct {
	// Owner and OwnerStart identify the process that made the cluster.
	Owner      int    `json:"owner"`
	OwnerStart string `json:"ownerStart"`
	// Work is the cluster's work directory, removed at the end.
	Work string `json:"work"`
	// Sysctls are the values before the cluster (path under /proc/sys → value).
	Sysctls map[string]string `json:"sysctls"`
	// Cgroups are the cgroup roots made for the kubelets, one name per node,
	// present in every cgroup v1 hierarchy (and the unified one, where runc
	// adds them).
	Cgroups []string `json:"cgroups"`
	// Processes are the daemons the cluster started and the nodes' inits
	// (PID and start time): those still alive are killed; a node's init
	// takes every process of its node (containers included) with it.
	Processes []process `json:"processes"`
}

type process struct {
	PID   int    `json:"pid"`
	Start string `json:"start"`
}

func (s *hostState) file() string { return filepath.Join(stateDir, strconv.Itoa(s.Owner)+".json") }

// save writes the state atomically.
func (s *hostState) save() error {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := s.file() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.file())
}

// readSysctls reads the current values of the recorded settings.
func readSysctls() map[string]string {
	out := map[string]string{}
	for _, k := range sysctls {
		if v, err := os.ReadFile(filepath.Join("/proc/sys", k)); err == nil {
			out[k] = strings.TrimSpace(string(v))
		}
	}
	return out
}

// undo restores the host: kills what is left in the nodes' namespaces,
// removes the cgroups, writes the sysctls back, removes the work directory
// and the state file. It goes on past errors and returns them all.
func (s *hostState) undo() error {
	var errs []error
	for _, p := range s.Processes {
		if alive(p.PID, p.Start) {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	for _, p := range s.Processes {
		for i := 0; i < 100 && alive(p.PID, p.Start); i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, root := range s.Cgroups {
		if err := removeCgroup(root); err != nil {
			errs = append(errs, err)
		}
	}
	for k, v := range s.Sysctls {
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", k, v, err))
		}
	}
	if s.Work != "" {
		if err := os.RemoveAll(s.Work); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", s.Work, err))
		}
	}
	if err := os.Remove(s.file()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Recover undoes what clusters whose process is gone left on the host. Up
// calls it first; it is safe to call any time (a live cluster's state is
// left alone).
func Recover() error {
	entries, err := os.ReadDir(stateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(stateDir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var s hostState
		if err := json.Unmarshal(data, &s); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
			continue
		}
		if alive(s.Owner, s.OwnerStart) {
			continue
		}
		if err := s.undo(); err != nil {
			errs = append(errs, fmt.Errorf("undo cluster of process %d: %w", s.Owner, err))
		}
	}
	return errors.Join(errs...)
}

// mountNamespace is the mount namespace of pid as /proc names it.
func mountNamespace(pid int) (string, error) {
	return os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
}

// cgroupHierarchies are the mounted cgroup hierarchies (v1 controllers and
// the unified one).
func cgroupHierarchies() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return out
}

// makeCgroup creates root in every v1 hierarchy (a kubelet's cgroupRoot
// must exist), with cpuset's cpus and mems copied from the parent so that
// tasks may join it.
func makeCgroup(root string) error {
	for _, h := range cgroupHierarchies() {
		if filepath.Base(h) == "unified" {
			continue
		}
		dir := filepath.Join(h, root)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s/%s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

// removeCgroup removes root and everything under it from every hierarchy,
// deepest first (a cgroup is removed with rmdir once it has no tasks and no
// children), retrying while the last tasks exit.
func removeCgroup(root string) error {
	var errs []error
	for _, h := range cgroupHierarchies() {
		top := filepath.Join(h, root)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var err error
		for i := 0; i < 50; i++ {
			if err = rmdirTree(top); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", top, err))
		}
	}
	return errors.Join(errs...)
}

func rmdirTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := rmdirTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// HostSnapshot is what a cluster may change on the host, read off it: a
// test takes one before Up and compares one after Down.
type HostSnapshot struct {
	// Sysctls are the global kernel settings kubelets change.
	Sysctls map[string]string
	// Cgroups are the top-level cgroups of every hierarchy.
	Cgroups []string
	// Mounts are the mount points of the host's mount namespace.
	Mounts []string
	// Interfaces and Routes are those of the host's network namespace (PID 1's).
	Interfaces, Routes []string
	// Processes are the names of running processes that only a cluster runs.
	Processes []string
}

// TakeHostSnapshot reads the host's state.
func TakeHostSnapshot() (HostSnapshot, error) {
	s := HostSnapshot{Sysctls: readSysctls()}
	for _, h := range cgroupHierarchies() {
		entries, err := os.ReadDir(h)
		if err != nil {
			return s, err
		}
		for _, e := range entries {
			if e.IsDir() {
				s.Cgroups = append(s.Cgroups, filepath.Join(filepath.Base(h), e.Name()))
			}
		}
	}
	mi, err := os.ReadFile("/proc/1/mountinfo")
	if err != nil {
		return s, err
	}
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 4 {
			s.Mounts = append(s.Mounts, f[4])
		}
	}
	for file, dst := range map[string]*[]string{"/proc/1/net/dev": &s.Interfaces, "/proc/1/net/route": &s.Routes} {
		data, err := os.ReadFile(file)
		if err != nil {
			return s, err
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			if file == "/proc/1/net/dev" && len(f) > 0 && !strings.Contains(f[0], ":") {
				continue // the second header line
			}
			if file == "/proc/1/net/dev" {
				*dst = append(*dst, strings.TrimSuffix(f[0], ":"))
			} else {
				*dst = append(*dst, strings.Join(f[:3], " "))
			}
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		if slices.Contains(daemons, name) {
			s.Processes = append(s.Processes, name)
		}
	}
	for _, l := range []*[]string{&s.Cgroups, &s.Mounts, &s.Interfaces, &s.Routes, &s.Processes} {
		slices.Sort(*l)
	}
	return s, nil
}

// daemons are the process names only a cluster runs (comm is at most 15
// bytes); other tests run etcd and kube-apiserver of their own.
var daemons = []string{"kubelet", "kube-proxy", "containerd", "containerd-shim", "kube-controller", "kube-scheduler"}

// lockFile serializes clusters on one machine: test packages run in
// parallel, and two clusters would share the kubelets' global sysctls (and
// the machine's two cores).
const lockFile = "/run/hybrid-ccm/cluster.lock"

// lockHost takes the machine's cluster lock, waiting for another cluster to
// go down; the kernel releases it if the process dies.
func lockHost(ctx context.Context) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(lockFile), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(lockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", lockFile, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for another cluster on this machine to go down (%s): %w", lockFile, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}
