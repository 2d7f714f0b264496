package proxy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/hybrid-ccm/hybrid-ccm/"

// importRule is what one package of the gate's proxy may import. The
// direction itself — wire, then the views, then the HTTP layer — is kept by
// the compiler: a package cannot import one that imports it. These rules
// keep each package to the ones below it that it is meant to use (no
// sideways import between the views, no package of the gate below the HTTP
// layer), and the wire free of the Kubernetes API and of HTTP.
type importRule struct {
	// module: the packages of this module it may import (paths in the
	// module, without its prefix).
	module []string
	// never: prefixes of packages it must not depend on, directly or not.
	never []string
}

var importRules = map[string]importRule{
	"coordinator/gate/proxy/wire": {
		never: []string{"k8s.io/", "sigs.k8s.io/", "net/http", module},
	},
	"coordinator/gate/proxy/service": {
		module: []string{"coordinator/gate/proxy/wire"},
		never:  []string{"k8s.io/client-go/", "net/http/httputil"},
	},
	"coordinator/gate/proxy/serviceview": {
		module: []string{"coordinator/gate/proxy/wire", "coordinator/gate/proxy/service"},
		never:  []string{"net/http/httputil"},
	},
	"coordinator/gate/proxy/nodeview": {
		module: []string{"coordinator/gate/proxy/wire"},
		never:  []string{"k8s.io/client-go/", "net/http/httputil"},
	},
	"coordinator/gate/proxy/internal/servicetest": {
		module: []string{"coordinator/gate/proxy/wire", "coordinator/gate/proxy/service"},
	},
	// The HTTP layer: server, routing, lookups and the wiring of the rest.
	"coordinator/gate/proxy": {
		module: []string{
			"ccm/names",
			"coordinator/gate/proxy/wire", "coordinator/gate/proxy/service",
			"coordinator/gate/proxy/serviceview", "coordinator/gate/proxy/nodeview",
		},
	},
}

// TestImportRules checks every package under coordinator/gate/proxy against
// importRules (their non-test imports, as go list reads them), and that
// every package has a rule.
func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", "./...").Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("go list: %v\n%s", err, exit.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	seen := 0
	for {
		var p struct {
			ImportPath    string
			Imports, Deps []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		seen++
		path := strings.TrimPrefix(p.ImportPath, module)
		rule, ok := importRules[path]
		if !ok {
			t.Errorf("%s has no import rule: add one to importRules", path)
			continue
		}
		for _, imp := range p.Imports {
			if in, ok := strings.CutPrefix(imp, module); ok && !slices.Contains(rule.module, in) {
				t.Errorf("%s imports %s, which it must not", path, in)
			}
		}
		for _, dep := range p.Deps {
			for _, never := range rule.never {
				if strings.HasPrefix(dep, never) {
					t.Errorf("%s depends on %s, which it must not", path, dep)
				}
			}
		}
	}
	if seen < 2 {
		t.Fatalf("go list found %d packages", seen)
	}
}
