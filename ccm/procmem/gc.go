// Package procmem holds the Go runtime memory settings that Hybrid CCM's
// long-running processes share. It sets them and nothing else: it reads no
// memory figures and does not touch the process's mappings.
package procmem

import (
	"os"
	"runtime/debug"
)

// DefaultGCPercent sets the Go heap's growth between collections to percent
// unless the GOGC environment variable sets it. A controller's live heap is
// mostly its caches; below the runtime's 100 it holds less headroom above
// them for a little more collection work.
func DefaultGCPercent(percent int) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(percent)
	}
}
