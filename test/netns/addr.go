package netns

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// AddLoopbackAddress puts an IPv4 address (/32) on lo inside the namespace,
// e.g. a cloud's instance metadata address, so that a test's fake can listen
// there and a request to it is answered and seen instead of failing unseen.
// n numbers the alias (lo:n); use a different n per address.
func AddLoopbackAddress(n int, a netip.Addr) error {
	if !Isolated() {
		return fmt.Errorf("netns: %s: not inside the test's network namespace", a)
	}
	if !a.Is4() {
		return fmt.Errorf("netns: %s: only IPv4 addresses", a)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	name := fmt.Sprintf("lo:%d", n)
	set := func(req uint, addr [4]byte) error {
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		if err := ifr.SetInet4Addr(addr[:]); err != nil {
			return err
		}
		return unix.IoctlIfreq(fd, req, ifr)
	}
	if err := set(unix.SIOCSIFADDR, a.As4()); err != nil {
		return fmt.Errorf("netns: add %s to lo: %w", a, err)
	}
	if err := set(unix.SIOCSIFNETMASK, [4]byte{255, 255, 255, 255}); err != nil {
		return fmt.Errorf("netns: netmask of %s: %w", a, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
