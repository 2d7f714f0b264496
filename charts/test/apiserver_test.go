package charts_test

import (
	"sync"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

var (
	cpOnce sync.Once
	cp     *testenv.Env
	cpErr  error
)

// controlPlane starts the real kube-apiserver + etcd once for the package, with
// the NativeCCM CRD of charts/ccm-coordinator and the stand-in for the CRD Talos
// installs for its ServiceAccount kind.
func controlPlane(t *testing.T) *testenv.Env {
	t.Helper()
	cpOnce.Do(func() {
		cp, cpErr = testenv.Start(testenv.Options{CRDDirectoryPaths: []string{
			testenv.RepoRoot() + "/charts/ccm-coordinator/crds",
			"testdata/crds",
		}})
	})
	if cpErr != nil {
		t.Fatal(cpErr)
	}
	return cp
}

func stopControlPlane() {
	if cp != nil {
		_ = cp.Stop()
	}
}
