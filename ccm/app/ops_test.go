package app

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every operation in talos-ccm that wraps its errors names itself one way,
// as Go names it: `const op = "pkg.Func"` for a function and
// "pkg/Type.Method" for a method, pkg being the package's name, and wraps as
// fmt.Errorf("%s: ...: %w", op, ...). This test keeps the spellings from
// drifting apart again (they were "cloud/...", "ccm/csr.X.Y" and "cloud-node:").
func TestOpsNameTheirPackageAndFunction(t *testing.T) {
	opRE := regexp.MustCompile(`^([a-z][a-z0-9]*)(/[A-Z][A-Za-z0-9]*)?\.[A-Za-z][A-Za-z0-9]*$`)
	var seen int
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			spec, ok := n.(*ast.ValueSpec)
			if !ok || len(spec.Names) != 1 || spec.Names[0].Name != "op" || len(spec.Values) != 1 {
				return true
			}
			lit, ok := spec.Values[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			op, _ := strconv.Unquote(lit.Value)
			seen++
			m := opRE.FindStringSubmatch(op)
			switch {
			case m == nil:
				t.Errorf("%s: op %q is not pkg.Func or pkg/Type.Method", path, op)
			case m[1] != f.Name.Name:
				t.Errorf("%s: op %q does not start with its package name %q", path, op, f.Name.Name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen == 0 {
		t.Fatal("no op constants found: the test does not look where the code is")
	}
}
