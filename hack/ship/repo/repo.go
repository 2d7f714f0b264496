// Package repo finds the repository's root from the working directory. It
// imports only the standard library: hack/ship (whose commands run at the
// root or below it) and test/testenv (whose tests run in their package's
// directory, and whose binaries have no source paths to go by when built
// with -trimpath) both use it.
package repo

import (
	"errors"
	"os"
	"path/filepath"
)

// Root returns the nearest directory at or above the working directory that
// holds go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod at or above the working directory")
		}
		dir = parent
	}
}
