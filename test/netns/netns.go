// Package netns runs a test binary inside a network namespace of its own,
// with only the loopback interface, up. Packages whose tests run third-party
// binaries (upstream CCMs, which may call a cloud's metadata service) or
// listen on fixed ports (the ports the charts render) call Main from their
// TestMain: nothing they start can reach beyond this machine's loopback, and
// two such packages run in parallel by `go test ./...` never share a port.
//
// It needs root (CAP_SYS_ADMIN); when the namespace cannot be made the test
// binary fails: it never falls back to the host's network.
package netns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// marker tells the re-executed test binary that it already runs inside the
// namespace.
const marker = "HYBRIDCCM_NETNS"

// Main runs the test binary's tests inside a new network namespace: called
// from TestMain before anything else, it re-executes the binary there and
// exits with its exit code; inside, it brings lo up and calls run (usually a
// function that calls m.Run) and returns its code.
func Main(run func() int) int {
	if os.Getenv(marker) == "" {
		return reexec()
	}
	if err := LoopbackUp(); err != nil {
		fmt.Fprintf(os.Stderr, "netns: %v\n", err)
		return 1
	}
	return run()
}

func reexec() int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "netns: %v\n", err)
		return 1
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), marker+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "netns: cannot run the tests in a network namespace of their own (root needed): %v\n", err)
		return 1
	}
	return 0
}

// LoopbackUp sets IFF_UP on lo, which a new network namespace starts with
// down, and checks that lo is the namespace's only interface. Main calls it;
// a program that makes its own namespace (hybridctl demo) calls it inside.
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
			return fmt.Errorf("interface %s in the test's network namespace: only lo may exist", i.Name)
		}
		if i.Flags&net.FlagUp == 0 {
			return fmt.Errorf("lo is down")
		}
	}
	return nil
}

// Isolated reports whether the caller runs inside the namespace Main made.
func Isolated() bool { return os.Getenv(marker) != "" }
