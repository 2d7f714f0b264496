// Package netns runs a program inside a network namespace of its own, with
// only the loopback interface, up. Packages whose tests run third-party
// binaries (upstream CCMs, which may call a cloud's metadata service) or
// listen on fixed ports (the ports the charts render) call Main from their
// TestMain: nothing they start can reach beyond this machine's loopback, and
// two such packages run in parallel by `go test ./...` never share a port.
// `hybridctl demo` runs itself in one the same way (Reexec), for the same
// reasons.
//
// It needs root (CAP_SYS_ADMIN); when the namespace cannot be made the
// program fails: it never falls back to the host's network.
//
// hybridctl links this package: it must not import testing (the test in
// cmd/hybridctl checks).
package netns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// marker tells the re-executed program that it runs inside the namespace.
// Its value is the PID of the process that re-executed it, so that the
// program's own children, which inherit the environment, are not taken for
// it.
const marker = "HYBRIDCCM_NETNS"

// Main runs a test binary's tests inside a new network namespace: called
// from TestMain before anything else, it re-executes the binary there
// (Reexec) and returns its exit status; inside, it brings lo up and calls run
// (usually a function that calls m.Run) and returns its code.
func Main(run func() int) int {
	if !Isolated() {
		code, err := Reexec()
		if err != nil {
			fmt.Fprintf(os.Stderr, "netns: %v\n", err)
			return 1
		}
		return code
	}
	if err := LoopbackUp(); err != nil {
		fmt.Fprintf(os.Stderr, "netns: %v\n", err)
		return 1
	}
	return run()
}

// forwarded are the signals that ask a program to stop; Reexec passes them
// on.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// Reexec runs this program again, with the same arguments, environment and
// standard streams, in a new network namespace whose only interface is lo
// (down until the program calls LoopbackUp; Main does), waits for it and
// returns its exit status, 128+n if signal n ended it (as a shell reports
// it). Inside, Isolated is true.
//
// While it runs, SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to this process
// are passed on to it, so that it can stop cleanly whether the signal came
// from a terminal (which signals the whole process group: it then gets the
// signal twice) or was sent to this process only (kill, a supervisor, `go
// test`'s timeout). If this process dies, the kernel kills it (parent-death
// signal).
func Reexec() (int, error) {
	self, err := os.Executable() // not /proc/self/exe: ps shows the program's own name
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), marker+"="+strconv.Itoa(os.Getpid()))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}

	sigs := make(chan os.Signal, len(forwarded))
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("run %s in a network namespace of its own (root needed): %w", os.Args[0], err)
	}
	done := make(chan struct{})
	forwarding := make(chan struct{})
	go func() {
		defer close(forwarding)
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	<-forwarding
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

// Isolated reports whether this process is the program Reexec (or Main)
// started in its namespace.
func Isolated() bool {
	return os.Getenv(marker) == strconv.Itoa(os.Getppid())
}

// LoopbackUp sets IFF_UP on lo, which a new network namespace starts with
// down, and checks that lo is the namespace's only interface. Main calls it;
// a program that calls Reexec itself (hybridctl demo) calls it inside.
func LoopbackUp() error {
	if err := setLoopbackUp(); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return onlyLoopback()
}

func setLoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// onlyLoopback checks the namespace: lo is the only interface and it is up.
func onlyLoopback() error {
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, i := range ifs {
		if i.Name != "lo" {
			return fmt.Errorf("interface %s in the program's network namespace: only lo may exist", i.Name)
		}
		if i.Flags&net.FlagUp == 0 {
			return fmt.Errorf("lo is down")
		}
	}
	return nil
}
