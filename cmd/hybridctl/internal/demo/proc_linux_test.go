package demo_test

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// proc is one process as /proc shows it; start (jiffies after boot) tells it
// apart from a later process that reuses its PID.
type proc struct {
	pid, ppid int
	comm      string
	state     byte
	start     uint64
}

func (p proc) String() string { return fmt.Sprintf("%s (pid %d)", p.comm, p.pid) }

// readProc reads /proc/<pid>/stat; ok is false when there is no such process.
func readProc(pid int) (proc, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return proc{}, false
	}
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return proc{}, false
	}
	f := strings.Fields(s[closing+1:]) // state ppid pgrp ... (field 3 onwards)
	if len(f) < 20 {
		return proc{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	start, _ := strconv.ParseUint(f[19], 10, 64) // field 22, starttime
	return proc{pid: pid, ppid: ppid, comm: s[open+1 : closing], state: f[0][0], start: start}, true
}

// descendants returns every process below root (children, their children...).
func descendants(root int) []proc {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			children[p.ppid] = append(children[p.ppid], p)
		}
	}
	var out []proc
	queue := []int{root}
	for len(queue) > 0 {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
		queue = queue[1:]
	}
	return out
}

// running reports whether p still runs (same PID and start time, not a zombie).
func running(p proc) bool {
	now, ok := readProc(p.pid)
	return ok && now.start == p.start && now.state != 'Z'
}

// listener is a listening TCP socket.
type listener struct {
	addr  net.IP
	port  int
	inode string
}

func (l listener) String() string { return net.JoinHostPort(l.addr.String(), strconv.Itoa(l.port)) }

// tcpListeners returns every listening TCP socket of pid's network namespace.
func tcpListeners(pid int) []listener {
	var out []listener
	for _, file := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, file))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" { // TCP_LISTEN
				continue
			}
			hostHex, portHex, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			raw, err := hex.DecodeString(hostHex)
			if err != nil {
				continue
			}
			// the kernel prints the address as 32-bit words in host (little-endian) order
			ip := make(net.IP, len(raw))
			for i := 0; i+4 <= len(raw); i += 4 {
				ip[i], ip[i+1], ip[i+2], ip[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
			}
			port, _ := strconv.ParseInt(portHex, 16, 32)
			out = append(out, listener{addr: ip, port: int(port), inode: fields[9]})
		}
		_ = f.Close()
	}
	return out
}

// socketInodes returns the inodes of pid's open sockets.
func socketInodes(pid int) map[string]bool {
	out := map[string]bool{}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasPrefix(target, "socket:[") {
			out[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	return out
}

// listenersOf returns the listening TCP sockets the given processes hold in
// the network namespace of netnsPID.
func listenersOf(netnsPID int, procs []proc) map[string][]listener {
	all := tcpListeners(netnsPID)
	out := map[string][]listener{}
	for _, p := range procs {
		inodes := socketInodes(p.pid)
		for _, l := range all {
			if inodes[l.inode] {
				out[p.String()] = append(out[p.String()], l)
			}
		}
	}
	return out
}

// netNamespace identifies pid's network namespace ("" if it is gone).
func netNamespace(pid int) string {
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	return ns
}

// interfaces lists the network interfaces of pid's network namespace.
func interfaces(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n")[2:] {
		if name, _, ok := strings.Cut(line, ":"); ok {
			out = append(out, strings.TrimSpace(name))
		}
	}
	return out
}
