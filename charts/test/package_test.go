package charts_test

import (
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestPackagedFiles: what `helm package` and `make release` put in each
// chart is the chart — templates, values, schema, CRDs, README — not the
// repository's files around it (dotfiles, ci/ values, Go sources).
func TestPackagedFiles(t *testing.T) {
	for _, name := range []string{"talos-ccm", "ccm-coordinator", "native-ccm", "hybrid-ccm"} {
		ch, err := loader.LoadDir(filepath.Join(testenv.RepoRoot(), "charts", name))
		if err != nil {
			t.Fatal(err)
		}
		var files []string
		for _, f := range ch.Raw {
			files = append(files, f.Name)
		}
		for _, f := range files {
			base := filepath.Base(f)
			if strings.HasPrefix(base, ".") || strings.HasPrefix(f, "ci/") || strings.HasSuffix(f, ".go") || strings.HasPrefix(f, "charts/") {
				t.Errorf("chart %s packages %s", name, f)
			}
		}
		if len(files) == 0 {
			t.Errorf("chart %s packages nothing", name)
		}
	}
}
