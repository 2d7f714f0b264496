package publish

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestChartREADMEsCurrent fails when a chart's README.md (what `helm show
// readme` prints) is not what its Chart.yaml and values.yaml give now, and
// checks that it lists every value of values.yaml and ships in the chart.
func TestChartREADMEsCurrent(t *testing.T) {
	root := testenv.RepoRoot()
	for _, name := range ship.Charts {
		want, err := ChartREADME(root, name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(root, "charts", name, "README.md"))
		if err != nil || string(got) != string(want) {
			t.Errorf("charts/%s/README.md is not what its values.yaml gives (%v): run make manifests", name, err)
		}
		ch, err := loader.LoadDir(filepath.Join(root, "charts", name))
		if err != nil {
			t.Fatal(err)
		}
		var readme string
		for _, f := range ch.Files {
			if f.Name == "README.md" {
				readme = string(f.Data)
			}
		}
		if readme == "" {
			t.Errorf("chart %s packages no README.md: helm show readme prints nothing", name)
		}
		for key := range ch.Values {
			if !strings.Contains(readme, "| `"+key) {
				t.Errorf("charts/%s/README.md does not list value %s", name, key)
			}
		}
	}
}

// TestLicense: the LICENSE file is the license the images and charts name.
func TestLicense(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	if ship.License != "Apache-2.0" || !strings.Contains(string(b), "Apache License") || !strings.Contains(string(b), "Version 2.0, January 2004") {
		t.Errorf("LICENSE is not the text of %s", ship.License)
	}
	for _, name := range ship.Charts {
		ch, err := loader.LoadDir(filepath.Join(testenv.RepoRoot(), "charts", name))
		if err != nil {
			t.Fatal(err)
		}
		if got := ch.Metadata.Annotations["artifacthub.io/license"]; got != ship.License {
			t.Errorf("chart %s: license annotation %q, want %s", name, got, ship.License)
		}
		if ch.Metadata.Icon == "" || len(ch.Metadata.Maintainers) == 0 || ch.Metadata.Home == "" {
			t.Errorf("chart %s: icon %q, maintainers %v, home %q", name, ch.Metadata.Icon, ch.Metadata.Maintainers, ch.Metadata.Home)
		}
	}
}
