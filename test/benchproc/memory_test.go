package benchproc

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// allocEnv makes the test binary, run again as a child, the process
// TestStartMeasuresAGoProcess measures: it holds allocMiB of heap, touched,
// and waits to be killed.
const (
	allocEnv = "BENCHPROC_TEST_ALLOCATE"
	allocMiB = 48
)

var held [][]byte

func TestMain(m *testing.M) {
	if os.Getenv(allocEnv) != "" {
		for range allocMiB {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			held = append(held, b)
		}
		// Standard output and error reach the parent through one pipe, and
		// the runtime writes its GC trace line in pieces, after the
		// collection has let runtime.GC return: "allocated" can cut that
		// line in two, and a cut line is not read. So the collection with
		// all of it live comes after the last line this process writes.
		fmt.Fprintln(os.Stdout, "allocated")
		runtime.GC()
		time.Sleep(time.Hour)
	}
	os.Exit(m.Run())
}

// A Go process that holds 48 MiB of heap: its anonymous memory, its heap
// (from the GC trace) and, where a cgroup of its own could be made, its
// working set show them; its output reaches the log, and its cgroup is gone
// once it is stopped.
func TestStartMeasuresAGoProcess(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(allocEnv, "1")
	log := &testenv.Buffer{}
	p, err := Start(t.Logf, "test", log, exe, "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	// The forced collection's line, with all 48 MiB live, comes after
	// "allocated"; an earlier automatic one saw only part of it.
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(log.String(), "allocated") || p.Memory().HeapLive < allocMiB {
		if time.Now().After(deadline) {
			m := p.Stop(nil, 0)
			t.Fatalf("the child did not allocate and collect %d MiB within a minute (%s); its output:\n%s", allocMiB, m, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(3 * SampleInterval)
	var dir string
	if p.cg != nil {
		dir = p.cg.Dir()
	}
	m := p.Stop(nil, 0)
	t.Logf("%s", m)
	if m.Anon < allocMiB || m.Anon > 4*allocMiB {
		t.Errorf("anonymous memory %.1f MiB, want about the %d MiB held", m.Anon, allocMiB)
	}
	if m.HeapLive < allocMiB || m.Heap < m.HeapLive {
		t.Errorf("Go heap %.0f MiB, live %.0f MiB: want the %d MiB held live", m.Heap, m.HeapLive, allocMiB)
	}
	if dir == "" {
		t.Logf("no cgroup of its own here: working set not measured")
	} else {
		if !m.WorkingSetMeasured || m.WorkingSet < allocMiB {
			t.Errorf("working set %.1f MiB (measured %v), want at least the %d MiB held", m.WorkingSet, m.WorkingSetMeasured, allocMiB)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("cgroup %s left behind", dir)
		}
	}
}

// The GC trace is read from lines the runtime writes among other output, and
// written in pieces; a line another line cut in two is not read.
func TestGCTrace(t *testing.T) {
	var out strings.Builder
	tr := NewGCTrace(&out)
	for _, chunk := range []string{
		"I1128 08:00:00.000000 1 main.go:1] starting\n",
		"gc 1 @0.012s 2%: 0.018+1.2+0.003 ms clock, 0.036+0.4/0.9/0+0.007 ms cpu, 4->4->1 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P\n",
		"gc 2 @0.120s 3%: 0.02+2+0.01 ms clock, 0.04+0.1/1/0+0.02 ms cpu, 23->",
		"25->11 MB, 24 MB goal, 0 MB stacks, 1 MB globals, 2 P\n",
		"gc 3 @1.5s 1%: 0.02+2+0.01 ms clock, 0.04+0.1/1/0+0.02 ms cpu, 18->18->9 MB, 22 MB goal, 0 MB stacks, 1 MB globals, 2 P (forced)\n",
		"gc 4 @2.0s 1%: 0.02+2+0.01 ms clock, 0.04+0.1/1/0+0.02 ms cpu, 90->I1128 08:00:02 1 x.go:1] cut\n90->40 MB, 99 MB goal\n",
		"gc 5 @2.1s 1%: 0.02+2+0.01 ms clock",
	} {
		if n, err := io.WriteString(tr, chunk); err != nil || n != len(chunk) {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	peak, live, n := tr.Heap()
	if peak != 23 || live != 11 || n != 3 {
		t.Errorf("Heap() = %v, %v, %d; want 23, 11, 3 (the cut line not read)", peak, live, n)
	}
	if !strings.HasPrefix(out.String(), "I1128") || !strings.HasSuffix(out.String(), "ms clock") {
		t.Errorf("output not passed on whole: %q", out.String())
	}
}

// The working set is usage minus inactive file pages, as the kubelet reads
// it from either cgroup version's files.
func TestWorkingSet(t *testing.T) {
	for _, c := range []struct {
		name  string
		v2    bool
		files map[string]string // the cgroup's files
		want  uint64
		ok    bool
	}{
		{"v2", true, map[string]string{"memory.current": "10485760\n", "memory.stat": "anon 4194304\nfile 6291456\nactive_file 2097152\ninactive_file 4194304\n"}, 6 << 20, true},
		{"v1", false, map[string]string{"memory.usage_in_bytes": "10485760\n", "memory.stat": "cache 6291456\ninactive_file 1\ntotal_inactive_file 2097152\n"}, 8 << 20, true},
		{"inactive above usage", true, map[string]string{"memory.current": "100\n", "memory.stat": "inactive_file 200\n"}, 0, true},
		{"no stat", true, map[string]string{"memory.current": "100\n"}, 0, false},
		{"v1 files read as v2", true, map[string]string{"memory.usage_in_bytes": "100\n", "memory.stat": "total_inactive_file 0\n"}, 0, false},
	} {
		dir := t.TempDir()
		for name, v := range c.files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		got, ok := (&Cgroup{dir: dir, v2: c.v2}).WorkingSet()
		if got != c.want || ok != c.ok {
			t.Errorf("%s: WorkingSet() = %d, %v; want %d, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

func TestMax(t *testing.T) {
	got := Max(Memory{Anon: 20, Heap: 9, HeapLive: 4}, Memory{Anon: 18, Heap: 12, HeapLive: 3, WorkingSet: 30, WorkingSetMeasured: true})
	want := Memory{Anon: 20, Heap: 12, HeapLive: 4, WorkingSet: 30, WorkingSetMeasured: true}
	if got != want {
		t.Errorf("Max = %+v, want %+v", got, want)
	}
}
