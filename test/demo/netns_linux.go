package demo

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
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

// netnsAddress is an address on lo of the demo's network namespace, with a
// default route through lo: kube-apiserver refuses to start without a
// default route and a global address to advertise (it binds 127.0.0.1
// nonetheless). RFC 2544's benchmarking range: nothing real is there, and the
// namespace has no way out anyway.
var netnsAddress = [4]byte{198, 18, 0, 1}

// loopbackUp brings up lo of a new network namespace (with it, 127.0.0.1 and
// ::1), adds netnsAddress to it and routes everything else to it.
func loopbackUp() error {
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
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return err
	}
	// RTM_NEWADDR: netnsAddress/32 on lo
	addr := make([]byte, unix.SizeofIfAddrmsg)
	addr[0] = unix.AF_INET                                    // family
	addr[1] = 32                                              // prefix length
	addr[3] = unix.RT_SCOPE_UNIVERSE                          // scope
	binary.NativeEndian.PutUint32(addr[4:], uint32(lo.Index)) // index
	addr = rtattr(addr, unix.IFA_LOCAL, netnsAddress[:])
	addr = rtattr(addr, unix.IFA_ADDRESS, netnsAddress[:])
	if err := netlinkDo(unix.RTM_NEWADDR, addr); err != nil {
		return fmt.Errorf("add %v to lo: %w", net.IP(netnsAddress[:]), err)
	}
	// RTM_NEWROUTE: default dev lo
	route := make([]byte, unix.SizeofRtMsg)
	route[0] = unix.AF_INET       // family, dst/src length 0, tos 0
	route[4] = unix.RT_TABLE_MAIN // table
	route[5] = unix.RTPROT_BOOT   // protocol
	route[6] = unix.RT_SCOPE_LINK // scope
	route[7] = unix.RTN_UNICAST   // type
	oif := make([]byte, 4)
	binary.NativeEndian.PutUint32(oif, uint32(lo.Index))
	route = rtattr(route, unix.RTA_OIF, oif)
	if err := netlinkDo(unix.RTM_NEWROUTE, route); err != nil {
		return fmt.Errorf("default route via lo: %w", err)
	}
	return nil
}

// rtattr appends a netlink route attribute to b.
func rtattr(b []byte, typ uint16, data []byte) []byte {
	n := unix.SizeofRtAttr + len(data)
	attr := make([]byte, (n+unix.RTA_ALIGNTO-1) & ^(unix.RTA_ALIGNTO-1))
	binary.NativeEndian.PutUint16(attr[0:], uint16(n))
	binary.NativeEndian.PutUint16(attr[2:], typ)
	copy(attr[unix.SizeofRtAttr:], data)
	return append(b, attr...)
}

// netlinkDo sends one NLM_F_CREATE|NLM_F_EXCL request with body and waits
// for its acknowledgement.
func netlinkDo(typ uint16, body []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	binary.NativeEndian.PutUint32(msg[8:], 1) // sequence
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
			if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
				return syscall.Errno(-errno)
			}
			return nil
		}
	}
	return fmt.Errorf("no acknowledgement")
}
