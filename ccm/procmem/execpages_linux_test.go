package procmem

import (
	"encoding/json"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// initialized at package initialization; lives in the writable data that
// ReleaseExecPages must leave alone.
var initValue = map[string]int{"a": 1, "b": 2}

// ReleaseExecPages gives back file-backed resident memory, and the process
// goes on working: code runs again (faulted back in), read-only data reads
// the same, writable data set at init is intact.
func TestReleaseExecPages(t *testing.T) {
	const want = `{"a":1,"b":2}`
	before := rssFile()
	if before == 0 {
		t.Skip("no RssFile in /proc/self/status")
	}
	n, err := ReleaseExecPages()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile()
	t.Logf("file-backed RSS %d KiB -> %d KiB, released %d KiB", before>>10, after>>10, n>>10)
	if n == 0 || after >= before {
		t.Errorf("nothing released: RssFile %d -> %d, returned %d", before, after, n)
	}
	b, err := json.Marshal(initValue)
	if err != nil || string(b) != want {
		t.Errorf("after the release: %s, %v; want %s", b, err, want)
	}
	// New OS threads after the release (in a dynamically linked binary the
	// runtime creates them with pthread_create, through the relocated GOT).
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			time.Sleep(20 * time.Millisecond)
		}()
	}
	wg.Wait()
	if _, err := ReleaseExecPages(); err != nil {
		t.Errorf("a second release: %v", err)
	}
}

// TestCleanExecMappings: only the executable's private read-only mappings
// without a page of their own are released.
func TestCleanExecMappings(t *testing.T) {
	const exe = "/usr/bin/ccm"
	smaps := `00400000-00c00000 r-xp 00000000 08:01 42 /usr/bin/ccm
Size:               8192 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me
00c00000-01000000 r--p 00800000 08:01 42 /usr/bin/ccm
Anonymous:             0 kB
01000000-01010000 r--p 00c00000 08:01 42 /usr/bin/ccm
Anonymous:             8 kB
01010000-01020000 rw-p 00c10000 08:01 42 /usr/bin/ccm
Anonymous:            64 kB
01020000-01030000 r--p 00000000 08:01 43 /usr/lib/libc.so.6
Anonymous:             0 kB
01030000-01040000 r--p 00000000 08:01 44 /usr/bin/ccm (deleted)
Anonymous:             0 kB
7ffd0000-7ffd1000 r-xp 00000000 00:00 0
Anonymous:             0 kB
`
	got, err := cleanExecMappings(strings.NewReader(smaps), exe)
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]uint64{{0x00400000, 0x00c00000}, {0x00c00000, 0x01000000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("released %x, want %x", got, want)
	}
}

// TestReleaseDuringInitAddsUp: each call gives back what was touched since
// the one before, and InitReleased is the sum.
func TestReleaseDuringInitAddsUp(t *testing.T) {
	if rssFile() == 0 {
		t.Skip("no RssFile in /proc/self/status")
	}
	before, _ := InitReleased()
	ReleaseDuringInit()
	first, err := InitReleased()
	if err != nil {
		t.Fatal(err)
	}
	// touch the executable again
	if _, err := json.Marshal(map[string]any{"a": []int{1}, "b": initValue}); err != nil {
		t.Fatal(err)
	}
	ReleaseDuringInit()
	second, err := InitReleased()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("released %d KiB, then %d KiB", (first-before)>>10, (second-first)>>10)
	if first <= before || second <= first {
		t.Errorf("InitReleased %d -> %d -> %d bytes: a release that gave back nothing, or not added up", before, first, second)
	}
}
