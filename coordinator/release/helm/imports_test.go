package helm

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// helmModule is the Helm SDK's import path prefix.
const helmModule = "helm.sh/helm/"

// TestOnlyTheEngineLinksHelm: the release description, the gate, ccm-gate,
// hybridctl and the reconciler build without the Helm SDK (as the shipped
// binaries are built: GOOS=linux); only this package and what wires it in
// (cmd/ccm-coordinator) link it. A failure names the import chain that
// brings Helm in.
func TestOnlyTheEngineLinksHelm(t *testing.T) {
	const module = "github.com/hybrid-ccm/hybrid-ccm/"
	for _, tc := range []struct {
		// pattern is a go list package pattern.
		pattern string
		// helm says whether it links Helm.
		helm bool
	}{
		{pattern: module + "coordinator/release", helm: false},
		{pattern: module + "coordinator/gate/...", helm: false},
		{pattern: module + "coordinator/controller", helm: false},
		{pattern: module + "cmd/ccm-gate", helm: false},
		{pattern: module + "cmd/hybridctl/...", helm: false},
		// hybridctl's demo builds the ccm-gate image with it
		{pattern: module + "hack/ship", helm: false},
		// the controls: the engine and the binary that wires it in
		{pattern: module + "coordinator/release/helm", helm: true},
		{pattern: module + "cmd/ccm-coordinator", helm: true},
	} {
		t.Run(tc.pattern, func(t *testing.T) {
			imports := goList(t, "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", tc.pattern)
			graph := map[string][]string{}
			for _, line := range imports {
				f := strings.Fields(line)
				graph[f[0]] = f[1:]
			}
			roots := goList(t, "-f", "{{.ImportPath}}", tc.pattern)
			if len(roots) == 0 {
				t.Fatalf("%s matches no package", tc.pattern)
			}
			for _, root := range roots {
				chain := pathTo(graph, root, func(p string) bool { return strings.HasPrefix(p, helmModule) })
				switch {
				case tc.helm && chain == nil:
					t.Errorf("%s does not link Helm: is the check still looking at the right packages?", root)
				case !tc.helm && chain != nil:
					t.Errorf("%s links Helm: %s", root, strings.Join(chain, " → "))
				}
			}
		})
	}
}

// goList runs go list for linux and returns its output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Env = append(os.Environ(), "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			stderr = string(exit.Stderr)
		}
		t.Fatalf("go list %v: %v\n%s", args, err, stderr)
	}
	return slices.DeleteFunc(strings.Split(string(out), "\n"), func(s string) bool { return s == "" })
}

// pathTo returns the import chain from root to the first package found
// (breadth first) for which match is true, or nil.
func pathTo(graph map[string][]string, root string, match func(string) bool) []string {
	from := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if match(p) {
			var chain []string
			for ; p != ""; p = from[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, q := range graph[p] {
			if _, seen := from[q]; !seen {
				from[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}
