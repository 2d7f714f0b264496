package benchproc

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Children returns the processes whose parent is this process, by command
// name (the comm of /proc/<pid>/stat, such as kube-apiserver or etcd: the
// test control plane testenv starts).
func Children() map[string]int {
	out := map[string]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	self := strconv.Itoa(os.Getpid())
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// f[0] is the state, f[1] the parent
		if comm, f, ok := stat(pid); ok && len(f) > 1 && f[1] == self {
			out[comm] = pid
		}
	}
	return out
}

// MachineCPU returns the CPU time all CPUs spent busy (everything but idle
// and I/O wait) and in all, from /proc/stat.
func MachineCPU() (busy, total time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:] {
		ticks, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		d := time.Duration(ticks) * time.Second / clockTick
		total += d
		if i != 3 && i != 4 { // idle, iowait
			busy += d
		}
	}
	return busy, total
}

// Share is the CPU time that named processes used in a window, and the
// machine's: who the cores worked for while a figure was measured.
type Share struct {
	pids        map[string]int
	start       map[string]time.Duration
	busy, total time.Duration
	// Used is each process's CPU time in the window, after Stop.
	Used map[string]time.Duration
	// Busy is the machine's busy fraction in the window (0 – 1), after Stop.
	Busy float64
}

// StartShare starts measuring the processes in pids (name → pid). A process
// whose CPU time cannot be read at the start or at the end of the window (a
// pid of 0 for a process not found, one that exited) is not measured: it has
// no Used entry, and Describe says so.
func StartShare(pids map[string]int) *Share {
	s := &Share{pids: map[string]int{}, start: map[string]time.Duration{}}
	for name, pid := range pids {
		if d, ok := cpuTime(pid); pid > 0 && ok {
			s.pids[name], s.start[name] = pid, d
		}
	}
	s.busy, s.total = MachineCPU()
	return s
}

// Stop ends the window.
func (s *Share) Stop() *Share {
	s.Used = map[string]time.Duration{}
	for name, pid := range s.pids {
		if d, ok := cpuTime(pid); ok {
			s.Used[name] = d - s.start[name]
		}
	}
	busy, total := MachineCPU()
	if total > s.total {
		s.Busy = float64(busy-s.busy) / float64(total-s.total)
	}
	return s
}

// PerObject is a process's CPU time per object in milliseconds, the median
// over the windows that measured it; 0 when none did.
func PerObject(windows []*Share, name string, objects int) float64 {
	v, _ := perObject(windows, name, objects)
	return v
}

// perObject is PerObject, and whether any window measured the process.
func perObject(windows []*Share, name string, objects int) (float64, bool) {
	var v []float64
	for _, w := range windows {
		if w == nil {
			continue
		}
		if d, ok := w.Used[name]; ok {
			v = append(v, float64(d.Microseconds())/1000/float64(objects))
		}
	}
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	return v[len(v)/2], true
}

// Describe lists, for each name, the median CPU time per object over the
// windows ("kube-apiserver 3.60 ms, etcd 0.70 ms"), and the machine's lowest
// busy fraction.
func Describe(windows []*Share, names []string, objects int) string {
	parts := make([]string, 0, len(names)+1)
	for _, name := range names {
		if v, ok := perObject(windows, name, objects); ok {
			parts = append(parts, fmt.Sprintf("%s %.2f ms", name, v))
		} else {
			parts = append(parts, name+" not measured")
		}
	}
	low := 1.0
	for _, w := range windows {
		if w != nil && w.Used != nil {
			low = min(low, w.Busy)
		}
	}
	parts = append(parts, fmt.Sprintf("the cores busy ≥ %.0f %% of the time", 100*low))
	return strings.Join(parts, ", ")
}
