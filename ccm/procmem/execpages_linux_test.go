package procmem

import (
	"encoding/json"
	"testing"
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
	if _, err := ReleaseExecPages(); err != nil {
		t.Errorf("a second release: %v", err)
	}
}
