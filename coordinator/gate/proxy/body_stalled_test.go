package proxy_test

import (
	"io"
	"net/http"
	"runtime"
	"testing"
	"time"
)

// TestStalledBodies: the gate holds a request's whole body before forwarding
// it. A client that sends all but one byte of 3 MiB bodies on concurrent
// HTTP/2 streams of one connection and then stalls must not make the gate
// hold more than its budget of bodies (the gate container's memory limit is
// 64 MiB, coordinator/gate/sidecar.go): the bodies beyond it are answered
// 429 at once, and a body that never ends is answered 408 after the gate's
// body timeout. (Found by the review of the change that made the gate read
// bodies whole: 24 such streams held 91 MiB, and none was answered.)
func TestStalledBodies(t *testing.T) {
	for name, h2 := range map[string]bool{"HTTP/2, one connection": true, "HTTP/1.1, a connection each": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stalledBodies(t, h2)
		})
	}
}

func stalledBodies(t *testing.T, h2 bool) {
	url, c := tlsGate(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{}`)
	}), h2)
	c.Timeout = 0
	const streams = 24
	const size = 3 << 20
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	answered := make(chan int, streams)
	var writers []*io.PipeWriter
	sent := make(chan struct{}, streams)
	for range streams {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		go func() {
			chunk := make([]byte, 64<<10)
			for n := 0; n < size-1; n += len(chunk) {
				k := min(len(chunk), size-1-n)
				if _, err := pw.Write(chunk[:k]); err != nil {
					sent <- struct{}{} // refused: the transport stopped reading it
					return
				}
			}
			sent <- struct{}{}
			// ... and the last byte never comes
		}()
		go func() {
			req, _ := http.NewRequest(http.MethodPut, url+leasePath, pr)
			req.ContentLength = size
			req.Header.Set("Content-Type", "application/json")
			resp, err := c.Do(req)
			if err != nil {
				answered <- -1
				return
			}
			_ = resp.Body.Close()
			answered <- resp.StatusCode
		}()
	}
	t.Cleanup(func() {
		for _, w := range writers {
			_ = w.CloseWithError(io.ErrUnexpectedEOF)
		}
	})
	for range streams {
		select {
		case <-sent:
		case <-time.After(60 * time.Second):
			t.Fatal("the bodies were not taken")
		}
	}
	time.Sleep(time.Second)
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("heap in use grew by %d MiB holding %d stalled bodies", grown>>20, streams)
	if grown > 64<<20 {
		t.Errorf("%d stalled 3 MiB bodies on one connection hold %d MiB of the gate's heap, beyond its container's 64 MiB limit", streams, grown>>20)
	}
	// longer than ccm-gate's only server timeout (ReadHeaderTimeout 30s)
	codes := map[int]int{}
	for range streams {
		select {
		case code := <-answered:
			codes[code]++
		case <-time.After(45 * time.Second):
			t.Fatalf("answers so far %v: a stalled body was not answered within the gate's body timeout", codes)
		}
	}
	t.Logf("answers: %v", codes)
	if codes[http.StatusTooManyRequests] == 0 || codes[http.StatusRequestTimeout] == 0 || codes[http.StatusTooManyRequests]+codes[http.StatusRequestTimeout] != streams {
		t.Errorf("answers %v: want 429 beyond the budget and 408 for the bodies that never ended", codes)
	}
}
