package testenv

import (
	"bytes"
	"sync"
)

// Buffer collects output written from several goroutines (a process's stdout
// and stderr, a reader goroutine) and reads it back while that goes on.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
