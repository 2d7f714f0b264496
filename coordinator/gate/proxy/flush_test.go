package proxy

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// countingWriter records what reached the client and how often it was flushed.
type countingWriter struct {
	mu      sync.Mutex
	header  http.Header
	body    strings.Builder
	flushes int
	flushed string // body as of the last flush
}

func (c *countingWriter) Header() http.Header {
	if c.header == nil {
		c.header = http.Header{}
	}
	return c.header
}
func (c *countingWriter) WriteHeader(int) {}
func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.body.Write(p)
}
func (c *countingWriter) Flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushes++
	c.flushed = c.body.String()
}
func (c *countingWriter) state() (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flushes, c.flushed
}

func TestCoalescingWriter(t *testing.T) {
	t.Run("a lone write is flushed at once", func(t *testing.T) {
		cw := &countingWriter{}
		w := newCoalescingWriter(cw, time.Hour)
		_, _ = w.Write([]byte("event-1"))
		http.NewResponseController(w).Flush() // what httputil.ReverseProxy calls
		if n, got := cw.state(); n != 1 || got != "event-1" {
			t.Fatalf("flushes=%d flushed=%q", n, got)
		}
		w.close()
	})
	t.Run("a burst goes out in one flush at the end of the window", func(t *testing.T) {
		cw := &countingWriter{}
		w := newCoalescingWriter(cw, 500*time.Millisecond)
		var want strings.Builder
		for i := range 1000 {
			s := "event-" + string(rune('a'+i%26))
			want.WriteString(s)
			_, _ = w.Write([]byte(s))
			w.Flush()
		}
		if n, got := cw.state(); n != 1 || got != "event-a" {
			t.Fatalf("during the burst: flushes=%d flushed=%q, want only the first event out", n, got)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, got := cw.state()
			if n == 2 && got == want.String() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the window: flushes=%d, %d of %d bytes flushed", n, len(got), want.Len())
			}
			time.Sleep(5 * time.Millisecond)
		}
		w.close()
	})
	t.Run("no flush after close", func(t *testing.T) {
		cw := &countingWriter{}
		w := newCoalescingWriter(cw, 20*time.Millisecond)
		w.Flush()
		_, _ = w.Write([]byte("x"))
		w.Flush() // scheduled
		w.close()
		time.Sleep(60 * time.Millisecond)
		w.Flush()
		if n, _ := cw.state(); n != 1 {
			t.Fatalf("flushes=%d after close, want 1", n)
		}
	})
}
