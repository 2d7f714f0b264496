package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one daemon of the cluster: started with its log in the work
// directory, killed with the test process if that dies (parent-death signal),
// stopped with SIGTERM and, after a grace period, SIGKILL.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProc starts argv with its output appended to logDir/<name>.log.
func startProc(logDir, name string, argv []string, env []string) (*proc, error) {
	f, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "--- %s start: %q\n", time.Now().Format(time.RFC3339Nano), argv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// pid is the process ID.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process ended, and how.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil {
		return
	}
	if ok, _ := p.exited(); ok {
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
}

// kill sends SIGKILL (a power cut) and waits.
func (p *proc) kill() {
	if p == nil {
		return
	}
	if ok, _ := p.exited(); ok {
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
}

// run runs a short command and returns its combined output in the error.
func run(argv ...string) error {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%q: %w: %s", argv, err, out)
	}
	return nil
}

// alive reports whether pid is a live process started at start (the 22nd
// field of /proc/<pid>/stat), so that a reused PID is not taken for it.
func alive(pid int, start string) bool {
	s, err := procStart(pid)
	return err == nil && s == start
}

// procStart is the start time of pid in clock ticks since boot.
func procStart(pid int) (string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	// comm (field 2) may hold spaces and parentheses: fields count from the last ')'.
	i := len(data) - 1
	for i >= 0 && data[i] != ')' {
		i--
	}
	if i < 0 {
		return "", errors.New("bad stat")
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return "", errors.New("bad stat")
	}
	return fields[19], nil // field 22 overall
}

// start starts a daemon of the cluster (startProc) and records it in the
// host state, so that Recover kills it if the cluster's process dies first.
func (c *Cluster) start(name string, argv []string, env []string) (*proc, error) {
	p, err := startProc(c.logDir(), name, argv, env)
	if err != nil {
		return nil, err
	}
	st, _ := procStart(p.pid())
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	if c.state != nil {
		c.state.Processes = append(c.state.Processes, process{PID: p.pid(), Start: st})
		if err := c.state.save(); err != nil {
			p.kill()
			return nil, fmt.Errorf("record %s: %w", name, err)
		}
	}
	return p, nil
}

// spawns carries the cluster's process starts to one OS thread that lives as
// long as the process. The parent-death signal fires when the thread that
// forked a child exits, not the process, and the Go runtime ends a thread
// whenever a goroutine locked to it returns (listenIn's does): a daemon
// forked from such a thread would be killed with it, long before the
// cluster's process dies.
var (
	spawns    = make(chan spawnRequest)
	spawnOnce sync.Once
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked: this thread is the daemons' parent
			for r := range spawns {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawns <- spawnRequest{cmd: cmd, done: done}
	return <-done
}
