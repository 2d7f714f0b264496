package benchproc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Memory is what a pod running a process is sized by, in MiB: what the
// process allocates (its anonymous memory and Go heap) and what the kubelet
// charges its container (the working set). None of it counts the clean pages
// of the executable the process maps: those are page cache, shared and
// reclaimable.
type Memory struct {
	// Anon is the peak of the process's anonymous resident memory (RssAnon
	// in /proc/<pid>/status: Go heap, stacks, the runtime's own memory),
	// sampled every SampleInterval.
	Anon float64
	// Heap is the Go heap in use at its largest: the heap's size when a
	// collection started, the highest of the run (the Go runtime's GC trace,
	// GODEBUG=gctrace=1; whole MiB). HeapLive is the largest heap a
	// collection found live. Both 0 when the process printed no GC trace.
	Heap, HeapLive float64
	// WorkingSet is the peak working set of the process's memory cgroup as
	// the kubelet computes a container's (usage minus inactive file pages),
	// sampled every SampleInterval; 0 when the process ran in no cgroup of
	// its own (WorkingSetMeasured false).
	WorkingSet         float64
	WorkingSetMeasured bool
}

// String is the figures as the benchmarks log them.
func (m Memory) String() string {
	ws := "working set not measured (no cgroup of its own)"
	if m.WorkingSetMeasured {
		ws = fmt.Sprintf("working set %.1f MiB", m.WorkingSet)
	}
	heap := "Go heap not traced"
	if m.Heap > 0 {
		heap = fmt.Sprintf("Go heap %.0f MiB (live %.0f MiB)", m.Heap, m.HeapLive)
	}
	return fmt.Sprintf("anonymous %.1f MiB, %s, %s", m.Anon, heap, ws)
}

// max is the larger of each figure of m and o.
func (m Memory) max(o Memory) Memory {
	return Memory{Anon: max(m.Anon, o.Anon), Heap: max(m.Heap, o.Heap), HeapLive: max(m.HeapLive, o.HeapLive),
		WorkingSet: max(m.WorkingSet, o.WorkingSet), WorkingSetMeasured: m.WorkingSetMeasured || o.WorkingSetMeasured}
}

// Max is the larger of each figure over ms: the peak of several runs.
func Max(ms ...Memory) Memory {
	var out Memory
	for _, m := range ms {
		out = out.max(m)
	}
	return out
}

// SampleInterval is how often a Watch reads a process's memory. A peak
// shorter than that may be missed; the kernel keeps no peak of anonymous
// memory or of a working set to read instead.
const SampleInterval = 10 * time.Millisecond

// Watch samples a process's anonymous memory and, if it runs in a Cgroup of
// its own, that cgroup's working set, and keeps their peaks.
type Watch struct {
	pid        int
	cg         *Cgroup
	mu         sync.Mutex
	anon, ws   float64
	stop, done chan struct{}
}

// WatchMemory starts sampling process pid (and cg, when not nil) every
// SampleInterval until Stop.
func WatchMemory(pid int, cg *Cgroup) *Watch {
	w := &Watch{pid: pid, cg: cg, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(SampleInterval)
		defer t.Stop()
		for {
			w.sample()
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *Watch) sample() {
	anon := MiB(w.pid, "RssAnon")
	var ws float64
	if w.cg != nil {
		if b, ok := w.cg.WorkingSet(); ok {
			ws = float64(b) / (1 << 20)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.anon, w.ws = max(w.anon, anon), max(w.ws, ws)
}

// Peak is the peaks sampled so far (Anon, WorkingSet).
func (w *Watch) Peak() Memory {
	w.sample()
	w.mu.Lock()
	defer w.mu.Unlock()
	return Memory{Anon: w.anon, WorkingSet: w.ws, WorkingSetMeasured: w.cg != nil}
}

// Stop takes a last sample, stops sampling and returns the peaks.
func (w *Watch) Stop() Memory {
	m := w.Peak()
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	return m
}

// GCTrace passes on what a process writes to its standard error and reads
// the Go runtime's GC trace in it (GODEBUG=gctrace=1), one line per
// collection: "gc 7 @0.412s 2%: ... ms cpu, 11->12->5 MB, 12 MB goal, ...",
// the heap in use when the collection started, when it ended, and live
// (MB there are MiB). The runtime writes a line in pieces, so a line another
// thread's output cut in two is not read; the next collection's is.
type GCTrace struct {
	out        io.Writer
	mu         sync.Mutex
	line       []byte
	peak, live float64
	gcs        int
}

// NewGCTrace passes everything written to it on to out.
func NewGCTrace(out io.Writer) *GCTrace { return &GCTrace{out: out} }

var gcLine = regexp.MustCompile(`^gc \d+ @[0-9.]+s \d+%: .* (\d+)->(\d+)->(\d+) MB, `)

// Write passes p on and reads the complete lines in it.
func (t *GCTrace) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.line = append(t.line, p...)
	for {
		i := bytes.IndexByte(t.line, '\n')
		if i < 0 {
			break
		}
		if m := gcLine.FindSubmatch(t.line[:i]); m != nil {
			start, _ := strconv.ParseFloat(string(m[1]), 64)
			live, _ := strconv.ParseFloat(string(m[3]), 64)
			t.peak, t.live, t.gcs = max(t.peak, start), max(t.live, live), t.gcs+1
		}
		t.line = t.line[i+1:]
	}
	if len(t.line) > 64<<10 { // no newline in sight: not a trace line
		t.line = t.line[:0]
	}
	t.mu.Unlock()
	return t.out.Write(p)
}

// Heap returns the largest heap in use when a collection started and the
// largest live heap, in MiB, and how many collections were read.
func (t *GCTrace) Heap() (peak, live float64, collections int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peak, t.live, t.gcs
}

// Process is a process a benchmark measures (Start).
type Process struct {
	Cmd   *exec.Cmd
	cg    *Cgroup
	watch *Watch
	trace *GCTrace
}

// Start starts bin with args as a process whose memory a benchmark reports:
// cold (ColdStart), in a memory cgroup of its own where the machine allows
// one (NewCgroup named name; logf says when it could not), with the Go
// runtime's GC trace on, and its memory sampled from its first instruction.
// Its standard output and error go to log through a pipe this process reads,
// as a container runtime reads a container's: the log's page cache is not
// charged to the process's cgroup. It dies with this process.
func Start(logf Logf, name string, log io.Writer, bin string, args ...string) (*Process, error) {
	if err := ColdStart(logf, bin); err != nil {
		return nil, err
	}
	p := &Process{trace: NewGCTrace(log)}
	cg, err := NewCgroup(name)
	if err != nil {
		logf("%s: its working set is not measured: %v", bin, err)
		p.Cmd = exec.Command(bin, args...)
	} else {
		p.cg = cg
		p.Cmd = cg.Command(bin, args...)
	}
	p.Cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	p.Cmd.Stdout, p.Cmd.Stderr = p.trace, p.trace
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		if p.cg != nil {
			_ = p.cg.Remove()
		}
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p.watch = WatchMemory(p.Cmd.Process.Pid, p.cg)
	return p, nil
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Memory is the process's memory figures so far (peaks since it started).
func (p *Process) Memory() Memory {
	m := p.watch.Peak()
	m.Heap, m.HeapLive, _ = p.trace.Heap()
	return m
}

// Stop sends the process sig (SIGKILL when nil), waits up to grace for it
// to exit and then kills it, removes its cgroup, and returns its memory
// figures (peaks over its life).
func (p *Process) Stop(sig os.Signal, grace time.Duration) Memory {
	m := p.Memory()
	p.watch.Stop()
	if sig == nil {
		sig, grace = os.Kill, time.Minute
	}
	_ = p.Cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { _ = p.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = p.Cmd.Process.Kill()
		<-done
	}
	if p.cg != nil {
		_ = p.cg.Remove()
	}
	return m
}

// Cgroup is a memory cgroup made for one measured process, so that its
// working set can be read as the kubelet reads a container's: cgroup v2
// memory.current minus inactive_file of memory.stat, or on a machine with
// the cgroup v1 memory controller memory.usage_in_bytes minus
// total_inactive_file (what cAdvisor reads on each).
type Cgroup struct {
	dir string
	v2  bool
}

// NewCgroup makes a memory cgroup named name (unique to this process's pid)
// beside or below this process's own: below it with cgroup v1, beside it with
// cgroup v2 (whose cgroups with processes hold no child with controllers),
// or below the root when this process is in the root. It needs the right to
// write there (root, or a delegated subtree).
func NewCgroup(name string) (*Cgroup, error) {
	name = fmt.Sprintf("hybrid-ccm-bench-%d-%s", os.Getpid(), name)
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	var v2path string
	for l := range strings.Lines(string(own)) {
		f := strings.SplitN(strings.TrimSpace(l), ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2path = f[2]
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "memory" { // cgroup v1's memory controller
				return makeCgroup(filepath.Join("/sys/fs/cgroup/memory", f[2], name), false)
			}
		}
	}
	const unified = "/sys/fs/cgroup"
	controllers, err := os.ReadFile(filepath.Join(unified, "cgroup.controllers"))
	if v2path == "" || err != nil || !strings.Contains(" "+string(controllers)+" ", " memory ") {
		return nil, errors.New("cgroup: no memory controller (neither cgroup v1's nor v2's at " + unified + ")")
	}
	parent := filepath.Join(unified, v2path)
	if v2path == "/" {
		// the root may hold processes and children with controllers
		_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory"), 0o644)
	} else {
		parent = filepath.Dir(parent)
	}
	return makeCgroup(filepath.Join(parent, name), true)
}

func makeCgroup(dir string, v2 bool) (*Cgroup, error) {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	c := &Cgroup{dir: dir, v2: v2}
	if _, ok := c.WorkingSet(); !ok {
		_ = c.Remove()
		return nil, fmt.Errorf("cgroup %s: no memory accounting in it", dir)
	}
	return c, nil
}

// Dir is the cgroup's directory.
func (c *Cgroup) Dir() string { return c.dir }

// Command is exec.Command(bin, args...) started in the cgroup: a shell that
// moves itself into it and then executes bin (same process, so bin's memory
// is charged to the cgroup from its first page).
func (c *Cgroup) Command(bin string, args ...string) *exec.Cmd {
	return exec.Command("/bin/sh", append([]string{"-c", `echo 0 > "$0/cgroup.procs" && exec "$@"`, c.dir, bin}, args...)...)
}

// WorkingSet is the cgroup's working set in bytes as the kubelet computes a
// container's: memory usage minus the inactive file pages (0 when those are
// larger). ok is false when the files cannot be read.
func (c *Cgroup) WorkingSet() (uint64, bool) {
	usageFile, inactive := "memory.usage_in_bytes", "total_inactive_file"
	if c.v2 {
		usageFile, inactive = "memory.current", "inactive_file"
	}
	b, err := os.ReadFile(filepath.Join(c.dir, usageFile))
	if err != nil {
		return 0, false
	}
	usage, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, false
	}
	stat, err := os.ReadFile(filepath.Join(c.dir, "memory.stat"))
	if err != nil {
		return 0, false
	}
	for l := range strings.Lines(string(stat)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), " "); ok && k == inactive {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, false
			}
			if n > usage {
				return 0, true
			}
			return usage - n, true
		}
	}
	return 0, false
}

// Remove removes the cgroup once its processes have exited (retrying for
// a few seconds while the last of them is reaped).
func (c *Cgroup) Remove() error {
	var err error
	for range 50 {
		if err = os.Remove(c.dir); err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup: %w", err)
}
