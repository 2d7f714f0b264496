package podrunner

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// sandboxEnv marks a process started by the runner as the sandbox helper: the
// value is the path of its sandboxSpec. The helper is the runner's own binary
// (/proc/self/exe), started in a new mount namespace; init() below takes over
// before main or the test framework run.
const sandboxEnv = "HYBRIDCCM_PODRUNNER_SANDBOX"

// sandboxSpec is what the helper needs to become a container.
type sandboxSpec struct {
	// Root is the container's root directory on the host.
	Root string `json:"root"`
	// Hostname in the container's own UTS namespace: the pod's name.
	Hostname string `json:"hostname,omitempty"`
	// Mounts are bind mounts into Root, in order.
	Mounts []sandboxMount `json:"mounts"`
	// ReadOnlyRoot remounts Root read-only after the mounts.
	ReadOnlyRoot bool `json:"readOnlyRoot,omitempty"`
	// Argv and Env of the program; Argv[0] without a slash is looked up in
	// Env's PATH inside the root.
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	// WorkingDir inside the root; empty: /.
	WorkingDir string `json:"workingDir,omitempty"`
	UID        uint32 `json:"uid"`
	GID        uint32 `json:"gid"`
	Groups     []int  `json:"groups,omitempty"`
}

type sandboxMount struct {
	// Source on the host, Target inside the root.
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

func init() {
	specPath := os.Getenv(sandboxEnv)
	if specPath == "" {
		return
	}
	// fd 3 reports a failure to become the container; it closes on exec.
	status := os.NewFile(3, "sandbox-status")
	syscall.CloseOnExec(3)
	err := sandbox(specPath)
	fmt.Fprintf(status, "%v", err)
	fmt.Fprintf(os.Stderr, "podrunner sandbox: %v\n", err)
	os.Exit(127)
}

// sandbox runs in the helper: it never returns unless it failed.
func sandbox(specPath string) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var s sandboxSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("spec %s: %w", specPath, err)
	}
	if s.Hostname != "" {
		if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
			return fmt.Errorf("host name %q: %w", s.Hostname, err)
		}
	}
	// Nothing mounted here may reach the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := unix.Mount(s.Root, s.Root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind root %s: %w", s.Root, err)
	}
	for _, m := range s.Mounts {
		if err := bindMount(s.Root, m); err != nil {
			return err
		}
	}
	proc := filepath.Join(s.Root, "proc")
	if err := os.MkdirAll(proc, 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	for _, d := range []string{"null", "zero", "random", "urandom"} {
		if err := bindMount(s.Root, sandboxMount{Source: "/dev/" + d, Target: "/dev/" + d}); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		_ = os.Symlink(target, filepath.Join(s.Root, "dev", name))
	}
	if s.ReadOnlyRoot {
		if err := unix.Mount("", s.Root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read-only root: %w", err)
		}
	}
	if err := unix.Chdir(s.Root); err != nil {
		return err
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot %s: %w", s.Root, err)
	}
	wd := s.WorkingDir
	if wd == "" {
		wd = "/"
	}
	if err := os.Chdir(wd); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	if len(s.Argv) == 0 {
		return fmt.Errorf("no command: neither the container nor the image sets one")
	}
	prog, err := lookPath(s.Argv[0], s.Env)
	if err != nil {
		return err
	}
	if err := unix.Setgroups(s.Groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := unix.Setresgid(int(s.GID), int(s.GID), int(s.GID)); err != nil {
		return fmt.Errorf("setgid %d: %w", s.GID, err)
	}
	if err := unix.Setresuid(int(s.UID), int(s.UID), int(s.UID)); err != nil {
		return fmt.Errorf("setuid %d: %w", s.UID, err)
	}
	// A credential change clears the parent-death signal; set it again so the
	// container dies with the runner.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("parent-death signal: %w", err)
	}
	if err := unix.Exec(prog, s.Argv, s.Env); err != nil {
		return fmt.Errorf("exec %s: %w", prog, err)
	}
	return nil
}

// bindMount mounts m.Source at root+m.Target, creating the target as a file or
// a directory like the source.
func bindMount(root string, m sandboxMount) error {
	target := filepath.Join(root, filepath.Clean("/"+m.Target))
	fi, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("mount %s: %w", m.Target, err)
	}
	if fi.IsDir() {
		err = os.MkdirAll(target, 0o755)
	} else {
		if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
				err = f.Close()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("mount point %s: %w", m.Target, err)
	}
	if err := unix.Mount(m.Source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", m.Target, err)
		}
	}
	return nil
}

// lookPath finds name in the PATH of env (inside the root).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in PATH %s", name, path)
}
