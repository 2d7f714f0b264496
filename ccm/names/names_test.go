package names_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestNoOtherDefinitions: outside this package, no Go file (tests included)
// spells out one of the well-known names as a string literal: each is used
// through this package, so that one change reaches every part.
func TestNoOtherDefinitions(t *testing.T) {
	wellKnown := map[string]string{
		names.PlatformLabel:      "names.PlatformLabel",
		names.UninitializedTaint: "names.UninitializedTaint",
	}
	root := testenv.RepoRoot()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || path == filepath.Join(root, "ccm", "names")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil {
					if use, ok := wellKnown[v]; ok {
						rel, _ := filepath.Rel(root, path)
						t.Errorf("%s spells out %q: use %s", rel, v, use)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestControllerAliases(t *testing.T) {
	for alias, name := range names.ControllerAliases() {
		switch name {
		case names.CloudNodeController, names.CSRApprovalController, names.IPAMController:
		default:
			t.Errorf("alias %s names %s, which is not a talos-ccm controller", alias, name)
		}
	}
}
