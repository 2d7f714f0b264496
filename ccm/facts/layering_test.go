package facts_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The facts flow one way: the Talos client (ccm/talos) → the facts source
// (ccm/facts) with its interpretation (ccm/cloud) → the controllers that
// consume them. A producer importing a consumer (as ccm/cloud once imported
// ccm/csr for its error values) turns that around; this test fails on it.
func TestProducersImportNoConsumer(t *testing.T) {
	const module = "github.com/hybrid-ccm/hybrid-ccm/"
	consumers := []string{"ccm/cloudnode", "ccm/csr", "ccm/ipam", "ccm/app"}
	for dir, forbidden := range map[string][]string{
		".":         append([]string{"ccm/cloud"}, consumers...),
		"../cloud":  consumers,
		"../talos":  append([]string{"ccm/facts", "ccm/cloud"}, consumers...),
		"../iplist": append([]string{"ccm/facts", "ccm/cloud", "ccm/talos"}, consumers...),
	} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			src, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				for _, c := range forbidden {
					if path == module+c || strings.HasPrefix(path, module+c+"/") {
						t.Errorf("%s imports %s", file, path)
					}
				}
			}
		}
	}
}
