package proxy

import (
	"net/http"
	"sync"
	"time"
)

// flushWindow bounds how long a streamed byte may wait in the gate during a
// burst. Outside a burst nothing waits.
const flushWindow = time.Millisecond

// coalescingWriter batches the flushes httputil.ReverseProxy makes after every
// read of a streaming response (watches, chunked lists). The reverse proxy
// flushes each read it relays, so a WatchList's initial events, which the API
// server sends back to back, would leave the gate as thousands of tiny TLS
// records. Here a flush goes out at once when none went out within the last
// window (a lone watch event is not delayed); inside a burst at most one per
// window goes out, carrying everything written since.
type coalescingWriter struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	window time.Duration

	mu     sync.Mutex
	last   time.Time
	timer  *time.Timer
	closed bool
}

func newCoalescingWriter(w http.ResponseWriter, window time.Duration) *coalescingWriter {
	return &coalescingWriter{w: w, rc: http.NewResponseController(w), window: window}
}

func (c *coalescingWriter) Header() http.Header { return c.w.Header() }

func (c *coalescingWriter) WriteHeader(code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w.WriteHeader(code)
}

func (c *coalescingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's other controls.
func (c *coalescingWriter) Unwrap() http.ResponseWriter { return c.w }

func (c *coalescingWriter) Flush() { _ = c.FlushError() }

// FlushError flushes now, or schedules one flush at the end of the window.
func (c *coalescingWriter) FlushError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.timer != nil {
		return nil
	}
	since := time.Since(c.last)
	if since >= c.window {
		c.last = time.Now()
		return c.rc.Flush()
	}
	c.timer = time.AfterFunc(c.window-since, c.delayedFlush)
	return nil
}

func (c *coalescingWriter) delayedFlush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = nil
	if c.closed {
		return
	}
	c.last = time.Now()
	_ = c.rc.Flush()
}

// close stops a pending flush; it must be called before the handler returns
// (the server flushes what is left).
func (c *coalescingWriter) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}
