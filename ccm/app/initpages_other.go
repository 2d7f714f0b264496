//go:build !linux

package app

// releasedInitPages stays 0 outside Linux.
var releasedInitPages uint64

// ReleaseInitPages does nothing outside Linux.
func ReleaseInitPages() (uint64, error) { return 0, nil }
