// Package netns runs a test binary inside a network namespace of its own that
// has only the loopback interface, so that nothing it starts (API server, fake
// clouds, pods of the pod runner) can reach anything but 127.0.0.0/8 and the
// addresses the test adds to lo: an unexpected call to a cloud API or to an
// instance metadata service fails instead of going out.
//
// It owns the re-exec of the running binary under CLONE_NEWNET and bringing
// lo up. It must not skip: a test that asked for the namespace fails when it
// cannot be made.
package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"unsafe"
)

// marker is set in the environment of the re-executed binary.
const marker = "HYBRID_CCM_NETNS_CHILD"

// Inside reports whether this process is the re-executed one, in its own
// network namespace.
func Inside() bool { return os.Getenv(marker) == "1" }

// Reexec runs this binary again with the same arguments in a new network
// namespace (needs root) and returns its exit code; the caller exits with it.
// In the child, Inside is true and Setup must be called before anything
// listens.
func Reexec(extraEnv ...string) (int, error) {
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(append(os.Environ(), marker+"=1"), extraEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 1, fmt.Errorf("netns: re-exec in a new network namespace: %w", err)
	}
	return 0, nil
}

// Setup brings lo up and adds each address (IPv4, /32) to it, and checks that
// lo is the only interface. Call it in the re-executed process.
func Setup(extra ...netip.Addr) error {
	if !Inside() {
		return errors.New("netns: not in the re-executed process")
	}
	ifs, err := interfaces()
	if err != nil {
		return err
	}
	if len(ifs) != 1 || ifs[0] != "lo" {
		return fmt.Errorf("netns: interfaces %v, want only lo", ifs)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("netns: socket: %w", err)
	}
	defer syscall.Close(fd)
	if err := up(fd, "lo"); err != nil {
		return err
	}
	for i, a := range extra {
		if !a.Is4() {
			return fmt.Errorf("netns: %s: only IPv4 addresses", a)
		}
		name := fmt.Sprintf("lo:%d", i+1)
		var req ifreqAddr
		copy(req.name[:], name)
		req.addr = syscall.RawSockaddrInet4{Family: syscall.AF_INET, Addr: a.As4()}
		if err := ioctl(fd, syscall.SIOCSIFADDR, unsafe.Pointer(&req)); err != nil {
			return fmt.Errorf("netns: add %s to lo: %w", a, err)
		}
		req.addr = syscall.RawSockaddrInet4{Family: syscall.AF_INET, Addr: [4]byte{255, 255, 255, 255}}
		if err := ioctl(fd, syscall.SIOCSIFNETMASK, unsafe.Pointer(&req)); err != nil {
			return fmt.Errorf("netns: netmask of %s: %w", a, err)
		}
		if err := up(fd, name); err != nil {
			return err
		}
	}
	return nil
}

type ifreqFlags struct {
	name  [syscall.IFNAMSIZ]byte
	flags uint16
	_     [22]byte
}

type ifreqAddr struct {
	name [syscall.IFNAMSIZ]byte
	addr syscall.RawSockaddrInet4
	_    [8]byte
}

func up(fd int, name string) error {
	var req ifreqFlags
	copy(req.name[:], name)
	if err := ioctl(fd, syscall.SIOCGIFFLAGS, unsafe.Pointer(&req)); err != nil {
		return fmt.Errorf("netns: flags of %s: %w", name, err)
	}
	req.flags |= syscall.IFF_UP
	if err := ioctl(fd, syscall.SIOCSIFFLAGS, unsafe.Pointer(&req)); err != nil {
		return fmt.Errorf("netns: bring %s up: %w", name, err)
	}
	return nil
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// interfaces lists the namespace's interfaces (netlink; /sys/class/net
// would show the namespace that mounted /sys).
func interfaces() ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	var out []string
	for _, i := range ifs {
		out = append(out, i.Name)
	}
	return out, nil
}
