package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// testingImportAllowed are the packages outside this module that hybridctl
// cannot help linking although they import testing, each with the reason. An
// entry that is no longer needed fails the test too, so that the list stays
// exact.
var testingImportAllowed = map[string]string{
	// The Talos machinery client (ccm/talos, which `transform explain --node`
	// uses) imports its constants package, which imports go-cni for one
	// constant; go-cni's testutils.go, a non-test file, imports testing for
	// two unexported helpers nothing calls. talos-ccm links it the same way.
	"github.com/containerd/go-cni": "siderolabs/talos machinery/constants → go-cni testutils.go",
}

// TestShippedBinaryLinksNoTesting asks the go command for every package that
// the hybridctl binary links, for the platforms it is built for (the release
// images' as hack/ship builds them, static; a Mac; this machine as `make
// build` builds it), and fails if any of them imports the standard library's
// testing packages (testing, testing/...): test helpers (a TestMain helper
// taking *testing.M, a constructor taking testing.TB) and test frameworks
// (ginkgo, testify) all come in that way. Each finding names the chain of
// imports from hybridctl that brings it in. (gomega is linked, through
// fluxcd/pkg/runtime/conditions, which the coordinator uses at run time; it
// does not import testing. envtest does not either.) The demo and the
// local simulation kit it runs on (test/fleet, test/cluster, test/registry,
// test/talosnode, test/fakeec2, test/fakelb, test/testenv, test/netns) are
// linked and must stay free of testing; their test helpers take small
// interfaces that *testing.T satisfies instead.
func TestShippedBinaryLinksNoTesting(t *testing.T) {
	type target struct {
		name string
		// env is added to the go command's environment
		env []string
	}
	var targets []target
	for _, p := range ship.DefaultPlatforms {
		goos, goarch, _ := strings.Cut(p, "/")
		targets = append(targets, target{name: p + " (image)", env: []string{"GOOS=" + goos, "GOARCH=" + goarch, "CGO_ENABLED=0"}})
	}
	targets = append(targets,
		target{name: "darwin/arm64", env: []string{"GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=0"}},
		target{name: "host (make build)"},
	)
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			g := linkedPackages(t, tg.env)
			if _, ok := g.imports[binaryPackage]; !ok {
				t.Fatalf("go list did not list %s", binaryPackage)
			}
			used := map[string]bool{}
			for _, pkg := range g.order {
				for _, imp := range g.imports[pkg] {
					if imp != "testing" && !strings.HasPrefix(imp, "testing/") {
						continue
					}
					if _, ok := testingImportAllowed[pkg]; ok {
						used[pkg] = true
						continue
					}
					t.Errorf("hybridctl links %s, which imports %s: %s", pkg, imp, strings.Join(g.chain(pkg), " → "))
				}
			}
			for pkg, why := range testingImportAllowed {
				if !used[pkg] {
					t.Errorf("%s (%s) no longer brings testing into hybridctl: remove it from testingImportAllowed", pkg, why)
				}
			}
		})
	}
}

// TestReleaseBinaryLinksNoDemo: the images' hybridctl (built with
// ship.ReleaseTags) links neither the demo nor the control-plane starter it
// runs on: envtest makes a cache directory when the program starts and
// panics where it cannot (a read-only image, a user without a home).
func TestReleaseBinaryLinksNoDemo(t *testing.T) {
	g := linkedPackages(t, []string{"GOFLAGS=-tags=" + ship.ReleaseTags, "CGO_ENABLED=0", "GOOS=linux"})
	for _, pkg := range g.order {
		for _, banned := range []string{"sigs.k8s.io/controller-runtime/pkg/envtest", "github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl/internal/demo", "github.com/hybrid-ccm/hybrid-ccm/test/"} {
			if pkg == banned || strings.HasPrefix(pkg, banned+"/") || (strings.HasSuffix(banned, "/") && strings.HasPrefix(pkg, banned)) {
				t.Errorf("the release hybridctl links %s: %s", pkg, strings.Join(g.chain(pkg), " → "))
			}
		}
	}
}

// binaryPackage is the package the hybridctl binary is built from.
const binaryPackage = "github.com/hybrid-ccm/hybrid-ccm/cmd/hybridctl"

// importGraph is what `go list -deps` says the binary links.
type importGraph struct {
	// order lists the packages, dependencies first
	order []string
	// imports maps a package to the packages it imports
	imports map[string][]string
}

// linkedPackages lists the packages the hybridctl binary links when built
// with env added to the environment (the same package graph `go build` hands
// the linker: no test files).
func linkedPackages(t *testing.T, env []string) importGraph {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", binaryPackage)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", env, err, stderr.String())
	}
	g := importGraph{imports: map[string][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		g.order = append(g.order, f[0])
		g.imports[f[0]] = f[1:]
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return g
}

// chain returns a shortest chain of imports from the binary's package to pkg.
func (g importGraph) chain(pkg string) []string {
	from := map[string]string{binaryPackage: ""}
	queue := []string{binaryPackage}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == pkg {
			var c []string
			for ; p != ""; p = from[p] {
				c = append(c, p)
			}
			slices.Reverse(c)
			return c
		}
		for _, imp := range g.imports[p] {
			if _, seen := from[imp]; !seen {
				from[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return []string{pkg}
}
