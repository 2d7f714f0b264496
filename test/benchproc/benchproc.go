// Package benchproc reads what the benchmarks report of a process they run:
// the memory a pod running it is sized by (its anonymous memory and Go heap,
// and its cgroup's working set as the kubelet computes it; see Memory), its
// CPU time (from /proc), and the sizes the benchmarks run at. It starts and
// measures processes; it does not decide what a figure must be.
package benchproc

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// NodesEnv names the node counts the scale benchmarks run at, comma-separated
// (default DefaultNodes; `make bench-10k` adds 10000).
const NodesEnv = "HYBRID_CCM_BENCH_NODES"

// DefaultNodes are the node counts when NodesEnv is unset.
var DefaultNodes = []int{1000, 5000}

// Nodes returns the node counts of NodesEnv, or DefaultNodes. A value that is
// not a positive integer is an error naming it.
func Nodes() ([]int, error) {
	v := strings.TrimSpace(os.Getenv(NodesEnv))
	if v == "" {
		return DefaultNodes, nil
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s=%q: %q is not a positive number of nodes", NodesEnv, v, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// RoundsEnv sets how many rounds a benchmark that reports the median of its
// rounds runs (an odd number, so that the median is one round).
const RoundsEnv = "HYBRID_CCM_BENCH_ROUNDS"

// Rounds returns the rounds of RoundsEnv, or def when it is unset.
func Rounds(def int) (int, error) {
	v := strings.TrimSpace(os.Getenv(RoundsEnv))
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n%2 == 0 {
		return 0, fmt.Errorf("%s=%q: want an odd number of rounds (1, 3, 5, ...), so that the median is one round", RoundsEnv, v)
	}
	return n, nil
}

// MiB reads a kB field of /proc/<pid>/status in MiB (RssAnon: the Go heap,
// stacks and the runtime's own memory; VmRSS adds the file pages the process
// maps, mostly its executable's, which the benchmarks do not report). 0 when
// it cannot be read.
func MiB(pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v / 1024
		}
	}
	return 0
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on
// every Linux architecture Go supports).
const clockTick = 100

// CPU returns the CPU time (user + system) the process has used so far; 0
// when it cannot be read.
func CPU(pid int) time.Duration {
	d, _ := cpuTime(pid)
	return d
}

// cpuTime is CPU, and whether /proc/<pid>/stat could be read.
func cpuTime(pid int) (time.Duration, bool) {
	_, f, ok := stat(pid)
	// f[0] is field 3 (state): utime is field 14, stime field 15
	if !ok || len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * time.Second / clockTick, true
}

// stat reads /proc/<pid>/stat: the command name (field 2, in parentheses, and
// it may hold spaces or parentheses itself) and the fields after it, from the
// state (field 3) on.
func stat(pid int) (comm string, fields []string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", nil, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", nil, false
	}
	return s[open+1 : end], strings.Fields(s[end+1:]), true
}

// Idle starts bin with no arguments as a measured process (Start), lets it
// run for settle (its package initialization) and returns its memory, then
// kills it. The benchmarks' memory baselines are such binaries: a process
// that links what a component must link and does nothing else.
func Idle(logf Logf, bin string, settle time.Duration) (Memory, error) {
	p, err := Start(logf, "idle", io.Discard, bin)
	if err != nil {
		return Memory{}, fmt.Errorf("memory baseline: %w", err)
	}
	time.Sleep(settle)
	exited := p.Cmd.ProcessState != nil || MiB(p.Pid(), "RssAnon") == 0
	m := p.Stop(nil, 0)
	if exited || m.Anon == 0 {
		return Memory{}, fmt.Errorf("memory baseline %s: no RssAnon for process %d (did it exit?)", bin, p.Pid())
	}
	return m, nil
}

// ProfilesEnv names a directory the benchmarks save the profiles of the
// processes they run to (heap, CPU; for `go tool pprof`), when set.
const ProfilesEnv = "HYBRID_CCM_BENCH_HEAP_PROFILES"

// SaveProfile fetches a pprof endpoint's profile from url with c and writes
// it to path. An answer other than 200 is an error quoting it.
func SaveProfile(c *http.Client, url, path string) error {
	resp, err := c.Get(url)
	if err != nil {
		return fmt.Errorf("profile %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, data)
	}
	if err == nil {
		err = os.WriteFile(path, data, 0o600)
	}
	if err != nil {
		return fmt.Errorf("profile %s: %w", url, err)
	}
	return nil
}

// Build compiles the package pkg (a path relative to the repository root
// root, such as ./cmd/talos-ccm) into the file out exactly as the release
// images compile their commands (ship.HostBuild): the memory the benchmarks
// report is that of the binary the product ships. A failed build is an error
// carrying the compiler's output.
func Build(root, out, pkg string) error {
	cmd := ship.HostBuild(context.Background(), root, out, pkg)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", pkg, err, msg)
	}
	return nil
}
