package helm

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release/releasetest"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current output")

// TestGoldenProfiles renders every built-in profile through the embedded chart
// and the post-renderer and compares the manifests with testdata/golden.
func TestGoldenProfiles(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(nil, Options{})
	for _, name := range set.Names() {
		t.Run(name, func(t *testing.T) {
			p, _ := set.Get(name)
			req, err := release.FromProfile(p, release.Instance{ReleaseName: "native-ccm-" + name, Namespace: "kube-system", Platform: p.Platforms[0]})
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.Render(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join("testdata", "golden", name+".yaml")
			if *update {
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run go test ./coordinator/release/helm -run TestGoldenProfiles -update)", err)
			}
			if got != string(want) {
				t.Errorf("rendered manifests differ from %s (run with -update after checking the change):\n%s", file, lineDiff(string(want), got))
			}
			releasetest.AssertLifecycleOnly(t, got, req.Lifecycle)
			releasetest.AssertLifecycleRules(t, got)
			releasetest.AssertDelegatedAuthn(t, releasetest.Decode(t, got), req.Lifecycle.ServiceAccountName(), req.Lifecycle.Namespace)
		})
	}
}

func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, c string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			c = g[i]
		}
		if a != c {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want: " + a + "\n  got:  " + c + "\n")
		}
	}
	return b.String()
}
