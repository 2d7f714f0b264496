package gate_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// env is the real control plane shared by the package's tests.
var env *testenv.Env

func TestMain(m *testing.M) {
	if _, err := testenv.AssetsDir(); err != nil {
		// Unit tests still run; integration tests skip themselves.
		os.Exit(m.Run())
	}
	crds := filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator", "crds")
	os.Exit(testenv.Run(m, testenv.Options{CRDDirectoryPaths: []string{crds}}, func(e *testenv.Env) { env = e }))
}

func needEnv(t *testing.T) *testenv.Env {
	t.Helper()
	if env == nil {
		t.Skip("no control plane: set KUBEBUILDER_ASSETS=$(hack/control-plane.sh)")
	}
	return env
}
