//go:build !linux

package procmem

// ReleaseExecPages does nothing outside Linux.
func ReleaseExecPages() (uint64, error) { return 0, nil }
