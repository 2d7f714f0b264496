// Package ship turns this repository into what a cluster runs: OCI images of
// the four commands, built without a Docker daemon, reproducibly, and the
// defaults every release shares (registry, version, images, charts).
// Publishing (images and Helm charts pushed to an OCI registry, the static
// manifests under docs/deploy) is hack/ship/publish.
//
// It links no Helm: hybridctl's demo builds the ccm-gate image with it.
package ship

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/repo"
)

// DefaultRegistry is where images and charts go unless told otherwise. The
// charts' values.yaml and ccm-coordinator's --gate-image default name images
// under it (publish.TestRepositoryDefaultsAgree).
const DefaultRegistry = "ghcr.io/hybrid-ccm"

// License is the SPDX expression of the project's license (LICENSE at the
// repository's root), the org.opencontainers.image.licenses of every image.
const License = "Apache-2.0"

// Source is the org.opencontainers.image.source of every image.
const Source = "https://github.com/hybrid-ccm/hybrid-ccm"

// Images are the commands shipped as images, each built from cmd/<name>.
var Images = []string{"talos-ccm", "ccm-coordinator", "ccm-gate", "hybridctl"}

// Charts are the charts a release pushes, subcharts before the umbrella.
var Charts = []string{"talos-ccm", "ccm-coordinator", "native-ccm", "hybrid-ccm"}

// DefaultPlatforms are the platforms of a release.
var DefaultPlatforms = []string{"linux/amd64", "linux/arm64"}

// HostPlatform is the linux platform of the machine running this code: what
// tests that run the images' binaries build (Options.Platforms).
func HostPlatform() string { return "linux/" + runtime.GOARCH }

// VersionChart is the chart whose appVersion is the version of everything a
// release ships; the other charts must agree (publish.TestRepositoryDefaultsAgree).
const VersionChart = "talos-ccm"

// GateImageSymbol is the string variable of cmd/ccm-coordinator holding the
// --gate-image default; image builds set it to the ccm-gate image they build.
const GateImageSymbol = "main.defaultGateImage"

// VersionSymbol is the string variable every binary reports as its version
// (cmd/internal/version.Version; --version, and the version ccm-coordinator
// installs its embedded native-ccm chart at); image builds set it to the
// release's.
const VersionSymbol = "github.com/hybrid-ccm/hybrid-ccm/cmd/internal/version.Version"

// FindRoot returns the repository root: the nearest directory at or above the
// working directory that holds go.mod (repo.Root).
func FindRoot() (string, error) { return repo.Root() }

// DefaultVersion is the appVersion of charts/talos-ccm: the version a build or
// release uses unless told otherwise.
func DefaultVersion(root string) (string, error) {
	p := filepath.Join(root, "charts", VersionChart, "Chart.yaml")
	data, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read version: %w", err)
	}
	var md struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &md); err != nil {
		return "", fmt.Errorf("read version: %s: %w", p, err)
	}
	if md.AppVersion == "" {
		return "", fmt.Errorf("%s: appVersion is empty", p)
	}
	return md.AppVersion, nil
}

// ImageRef is the reference a build gives image name.
func ImageRef(registry, name, version string) string {
	return registry + "/" + name + ":" + version
}

// ChartRef is where a release pushes chart name (without the oci:// scheme):
// beside the images, under charts/ so that chart and image tags never meet.
func ChartRef(registry, name, version string) string {
	return registry + "/charts/" + name + ":" + version
}

// commit is what a build records of the source: the revision and the time
// every file and the image config carry.
type commit struct {
	revision string
	time     time.Time
}

// sourceCommit reads HEAD of the repository at root. A tree with changes gets
// the revision "<sha>-dirty". SOURCE_DATE_EPOCH, when set, overrides the time;
// without git the revision is empty and the time is the Unix epoch.
func sourceCommit(root string) (commit, error) {
	c := commit{time: time.Unix(0, 0).UTC()}
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"-C", root}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(string(out)), nil
	}
	if _, err := os.Stat(filepath.Join(root, ".git")); err == nil {
		rev, err := git("rev-parse", "HEAD")
		if err != nil {
			return c, err
		}
		ts, err := git("log", "-1", "--format=%ct", "HEAD")
		if err != nil {
			return c, err
		}
		status, err := git("status", "--porcelain", "--untracked-files=no")
		if err != nil {
			return c, err
		}
		if status != "" {
			rev += "-dirty"
		}
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return c, fmt.Errorf("commit time %q: %w", ts, err)
		}
		c.revision, c.time = rev, time.Unix(sec, 0).UTC()
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return c, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err)
		}
		c.time = time.Unix(sec, 0).UTC()
	}
	return c, nil
}
