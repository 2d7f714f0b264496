// Package version is the version of the project's binaries: the release's,
// which image builds (hack/ship, make images/release) set at link time with
// -X on Version; "devel" in any other build.
package version

import (
	"fmt"
	"runtime"

	"github.com/Masterminds/semver/v3"
)

// Version is the release version (semver without "v", e.g. 0.2.0).
var Version = "devel"

// Symbol is the linker's name of Version (hack/ship sets it).
const Symbol = "github.com/hybrid-ccm/hybrid-ccm/cmd/internal/version.Version"

// Released reports whether Version is a release's (a semantic version).
func Released() bool {
	_, err := semver.StrictNewVersion(Version)
	return err == nil
}

// Line is what `<binary> --version` prints.
func Line(binary string) string {
	return fmt.Sprintf("%s %s (%s, %s/%s)", binary, Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
