package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// serviceViewLayers are the files of the Service view in the one direction
// their dependencies go: from the wire to the object, to the decision, to
// the emission, to HTTP. A file may use what the files before it declare,
// never what a file after it does.
var serviceViewLayers = []string{
	// (wire: package wire, below them all)
	// object: a Service read from the wire, the readers of lists and
	// watches, the history's source, and the PUT body with its class back
	"service.go", "servicereader.go", "servicesource.go", "servicewrite.go",
	// decision: which Services the CCM sees, which its watch's client
	// holds, what each event becomes
	"serviceview.go", "servicehistory.go", "servicewatch.go",
	// emission: the only writer of Services to the CCM
	"serviceemit.go",
	// HTTP: requests and answers
	"services.go",
}

// TestServiceViewLayers checks that the files of the Service view depend on
// each other in the order of serviceViewLayers, and that the other files of
// the package they use use none of them (no way back up through a helper).
func TestServiceViewLayers(t *testing.T) {
	uses := fileDependencies(t)
	rank := map[string]int{}
	for i, f := range serviceViewLayers {
		rank[f] = i
		if _, err := os.Stat(f); err != nil {
			t.Errorf("layer file %s: %v", f, err)
		}
	}
	for from, tos := range uses {
		rf, inView := rank[from]
		for _, to := range tos {
			rt, toView := rank[to]
			switch {
			case inView && toView && rt > rf:
				t.Errorf("%s uses %s, a later layer", from, to)
			case inView && !toView && from != "services.go":
				// A helper outside the view must not lead back into it.
				for _, back := range uses[to] {
					if _, ok := rank[back]; ok {
						t.Errorf("%s uses %s, which uses %s of the view", from, to, back)
					}
				}
			}
		}
	}
}

// fileDependencies maps each non-test file of the package to the files whose
// declarations it uses. The package is type-checked without its imports
// (every imported package is empty): only its own identifiers matter here.
func fileDependencies(t *testing.T) map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range pkgs {
		for _, f := range p.Files {
			files = append(files, f)
		}
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: emptyImporter{}, Error: func(error) {}}
	pkg, _ := conf.Check("proxy", fset, files, info)
	deps := map[string]map[string]bool{}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != pkg || !declaredAtTop(pkg, obj) {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		if deps[from] == nil {
			deps[from] = map[string]bool{}
		}
		deps[from][to] = true
	}
	out := map[string][]string{}
	for from, tos := range deps {
		for to := range tos {
			out[from] = append(out[from], to)
		}
		sort.Strings(out[from])
	}
	if !slices.Contains(out["services.go"], "serviceemit.go") {
		t.Fatalf("the dependencies were not found (services.go uses %v)", out["services.go"])
	}
	return out
}

// declaredAtTop: a package-level declaration, a method, or a field.
func declaredAtTop(pkg *types.Package, obj types.Object) bool {
	switch o := obj.(type) {
	case *types.Func:
		return o.Type().(*types.Signature).Recv() != nil || o.Parent() == pkg.Scope()
	case *types.Var:
		return o.IsField() || o.Parent() == pkg.Scope()
	default:
		return obj.Parent() == pkg.Scope()
	}
}

// emptyImporter imports every package as an empty one.
type emptyImporter struct{}

func (emptyImporter) Import(p string) (*types.Package, error) {
	pkg := types.NewPackage(p, path.Base(p))
	pkg.MarkComplete()
	return pkg, nil
}
