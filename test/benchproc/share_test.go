package benchproc

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A process this one starts is found by its command name, and its CPU time
// in a window is measured; the machine's busy share is a fraction.
func TestShareMeasuresAChild(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	// a shell that spins for a while, then sleeps until killed
	cmd := exec.Command(sh, "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	children := Children()
	if children["sh"] != cmd.Process.Pid {
		t.Fatalf("children %v: want sh with pid %d", children, cmd.Process.Pid)
	}
	s := StartShare(map[string]int{"sh": cmd.Process.Pid, "gone": 1 << 30})
	deadline := time.Now().Add(30 * time.Second)
	for {
		// the spinning is over once the shell became sleep
		if Children()["sleep"] == cmd.Process.Pid || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Stop()
	if s.Used["sh"] <= 0 {
		t.Errorf("the spinning shell used %v of CPU", s.Used["sh"])
	}
	if d, ok := s.Used["gone"]; ok {
		t.Errorf("a process that does not exist was measured: %v", d)
	}
	if s.Busy <= 0 || s.Busy > 1 {
		t.Errorf("busy fraction %v, want in (0, 1]", s.Busy)
	}
}

// A command name with spaces and parentheses is read whole (the kernel puts
// it in parentheses in /proc/<pid>/stat): the process is found by it, and its
// CPU time is read from the fields after it.
func TestChildrenReadsAnOddName(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	odd := filepath.Join(t.TempDir(), "a) (b")
	if err := os.Symlink(sh, odd); err != nil {
		t.Fatal(err)
	}
	// it spins until killed, keeping its name
	cmd := exec.Command(odd, "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if got := Children()["a) (b"]; got != cmd.Process.Pid {
		t.Fatalf("children %v: want %q with pid %d", Children(), "a) (b", cmd.Process.Pid)
	}
	for deadline := time.Now().Add(30 * time.Second); CPU(cmd.Process.Pid) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no CPU time read for a process that spins")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A process that exits during the window is not measured (no Used entry),
// and Describe says so instead of printing a figure.
func TestShareOfAProcessThatExits(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	cmd := exec.Command(sleep, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := StartShare(map[string]int{"brief": cmd.Process.Pid, "self": os.Getpid()})
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	s.Stop()
	if d, ok := s.Used["brief"]; ok {
		t.Errorf("a process gone at the window's end was measured: %v", d)
	}
	if _, ok := s.Used["self"]; !ok {
		t.Error("this process was not measured")
	}
	if d := Describe([]*Share{s}, []string{"brief"}, 1); !strings.Contains(d, "brief not measured") {
		t.Errorf("Describe = %q", d)
	}
}

// Per-object figures are the median over the windows, and a window without
// the process (or never stopped) does not count.
func TestPerObjectIsTheMedian(t *testing.T) {
	w := func(ms int) *Share {
		return &Share{Used: map[string]time.Duration{"p": time.Duration(ms) * time.Millisecond}, Busy: 0.9}
	}
	windows := []*Share{w(300), w(100), nil, w(200), {}}
	if got := PerObject(windows, "p", 100); got != 2 {
		t.Errorf("PerObject = %v ms, want 2 (the median of 1, 2 and 3)", got)
	}
	if got := PerObject(windows, "other", 100); got != 0 {
		t.Errorf("PerObject of a process in no window = %v, want 0", got)
	}
	d := Describe(windows, []string{"p", "absent"}, 100)
	if !strings.Contains(d, "p 2.00 ms") || !strings.Contains(d, "absent not measured") || !strings.Contains(d, "≥ 90 %") {
		t.Errorf("Describe = %q", d)
	}
	// a process not found (pid 0) is not measured rather than shown as 0 ms
	if s := StartShare(map[string]int{"absent": 0}).Stop(); len(s.Used) != 0 {
		t.Errorf("a pid of 0 was measured: %v", s.Used)
	}
}

func TestMachineCPU(t *testing.T) {
	busy, total := MachineCPU()
	if total <= 0 || busy <= 0 || busy > total {
		t.Errorf("busy %v of %v", busy, total)
	}
}

// A file read into the page cache is dropped from it.
func TestColdDropsAFileFromThePageCache(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(path, bytes.Repeat([]byte("x"), 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before, err := cached(f, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		t.Fatal(err)
	}
	if before == 0 || fs.Type == unix.TMPFS_MAGIC || fs.Type == unix.RAMFS_MAGIC {
		t.Skipf("the file system of %s keeps its files in memory (type %#x): nothing to drop", path, fs.Type)
	}
	left, err := Cold(path)
	if err != nil {
		t.Fatal(err)
	}
	// the file systems the benchmarks' temporary directories are on here
	// and in CI drop clean pages; others may keep them
	known := map[int64]bool{unix.EXT4_SUPER_MAGIC: true, unix.XFS_SUPER_MAGIC: true, unix.BTRFS_SUPER_MAGIC: true, unix.OVERLAYFS_SUPER_MAGIC: true}
	switch {
	case left != 0 && known[int64(fs.Type)]:
		t.Errorf("%d of %d bytes still cached after Cold", left, before)
	case left != 0:
		t.Skipf("file system type %#x kept %d of %d bytes cached", fs.Type, left, before)
	}
	if _, err := Cold(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Cold of a missing file: %v, want an error naming it", err)
	}
}
