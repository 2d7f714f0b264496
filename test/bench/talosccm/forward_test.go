package talosccm

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The Talos API path of a real cluster: talos-ccm's talosconfig names one
// endpoint, the Talos Service (talos.default), whose EndpointSlices list the
// control planes' apid; talos-ccm reads them through the API server and
// connects to one; that apid forwards each request to the machine it names
// over a connection of its own. In the benchmark the control planes' apid is
// a process of its own (apid/main.go) on the benchmark's cores, as apid runs
// on the control-plane machines that also run the API server, and the
// machines it forwards to are the simulated Talos nodes (this process).

// apidAddrs are where the control planes' apids listen: the machine's first
// IPv4 and first IPv6 address that is not loopback or link-local (the API
// server refuses those in an EndpointSlice), port 0. One EndpointSlice names
// one port, so one machine address per family lists one apid per slice: two
// control planes on a machine with both families.
func apidAddrs(b *testing.B) []string {
	ifaces, err := net.InterfaceAddrs()
	if err != nil {
		b.Fatal(err)
	}
	var v4, v6 string
	for _, a := range ifaces {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() {
			continue
		}
		switch {
		case ip.Is4() && v4 == "":
			v4 = netip.AddrPortFrom(ip, 0).String()
		case ip.Is6() && !ip.Is4In6() && v6 == "":
			v6 = netip.AddrPortFrom(ip, 0).String()
		}
	}
	var out []string
	for _, a := range []string{v4, v6} {
		if a != "" {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		b.Fatal("no address but loopback on this machine: the Talos Service's EndpointSlice cannot list the control planes' apid (the API server refuses loopback endpoints)")
	}
	return out
}

// apidProcess is the control planes' apid of one round.
type apidProcess struct {
	cmd   *exec.Cmd
	lines chan string
	addrs []netip.AddrPort
}

// startApid starts the control planes' apid (the binary bin), one listener
// per address in listen, forwarding to the simulated machines at nodes with
// the credentials in creds; its standard error goes to log.
// With profile set, it writes a CPU profile of its life there.
func startApid(b testing.TB, bin, creds, nodes string, listen []string, log *os.File, profile string) *apidProcess {
	args := []string{"-credentials", creds, "-nodes", nodes, "-listen", strings.Join(listen, ",")}
	if profile != "" {
		args = append(args, "-cpuprofile", profile)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &apidProcess{cmd: cmd, lines: make(chan string, 4)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	select {
	case l, ok := <-p.lines:
		f := strings.Fields(l)
		if !ok || len(f) < 2 || f[0] != "listening" {
			p.stop()
			b.Fatalf("the control planes' apid did not start (%q; its log: %s)", l, log.Name())
		}
		for _, a := range f[1:] {
			ap, err := netip.ParseAddrPort(a)
			if err != nil {
				b.Fatal(err)
			}
			p.addrs = append(p.addrs, ap)
		}
	case <-time.After(time.Minute):
		p.stop()
		b.Fatal("the control planes' apid did not start in a minute")
	}
	return p
}

func (p *apidProcess) pid() int { return p.cmd.Process.Pid }

// stop ends the process and returns what each apid forwarded (by address);
// nil if it did not say.
func (p *apidProcess) stop() map[string]int64 {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	counts := map[string]int64{}
	timeout := time.After(time.Minute)
	for done := false; !done; {
		select {
		case l, ok := <-p.lines:
			if !ok {
				done = true
				break
			}
			if f := strings.Fields(l); len(f) > 0 && f[0] == "forwarded" {
				for _, kv := range f[1:] {
					k, v, _ := strings.Cut(kv, "=")
					n, err := strconv.ParseInt(v, 10, 64)
					if err == nil {
						counts[k] = n
					}
				}
			}
		case <-timeout:
			_ = p.cmd.Process.Kill()
			done = true
		}
	}
	_ = p.cmd.Wait()
	return counts
}

// describeForwarded is "addr N, addr M".
func describeForwarded(counts map[string]int64, order []netip.AddrPort) string {
	var parts []string
	for _, a := range order {
		parts = append(parts, fmt.Sprintf("%s %d", a, counts[a.String()]))
	}
	return strings.Join(parts, ", ")
}
