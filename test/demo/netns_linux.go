package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// isolatedEnv marks the demo process that runs in a network namespace of its
// own (see RunIsolated).
const isolatedEnv = "HYBRIDCCM_DEMO_NETNS"

// Isolated reports whether this process is the demo in its own network
// namespace.
func Isolated() bool { return os.Getenv(isolatedEnv) != "" }

// RunIsolated runs this binary again, with the same arguments, in a new
// network namespace whose only interface is loopback, and returns its exit
// status. Everything the demo starts runs in there: the native CCM pods take
// the fixed ports of their profiles (secure port, gate ports), which must not
// meet another demo, a test or a real CCM on this machine, and nothing can
// listen beyond loopback. Ctrl-C reaches the demo directly (same process
// group); SIGINT or SIGTERM sent to this process only (ctx cancelled) are
// passed on as SIGINT. If this process dies, the kernel kills the demo
// (parent-death signal), which takes its own children along.
func RunIsolated(ctx context.Context) (int, error) {
	if os.Geteuid() != 0 {
		return 0, ErrNotRoot
	}
	self, err := os.Executable() // its name, not /proc/self/exe: ps shows the demo as hybridctl
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), isolatedEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start the demo in a network namespace of its own: %w", err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = cmd.Process.Signal(os.Interrupt)
		case <-done:
		}
	}()
	err = cmd.Wait()
	close(done)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return exit.ExitCode(), nil
	default:
		return 0, err
	}
}
