package v1alpha1

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestGeneratedCodeIsFresh regenerates deepcopy code and the CRD with the pinned
// controller-gen into a temporary directory and fails on any difference from the
// files in the tree (hack/coordinator-generate.sh --verify).
func TestGeneratedCodeIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("runs controller-gen")
	}
	root := testenv.RepoRoot()
	cmd := exec.Command("bash", filepath.Join(root, "hack", "coordinator-generate.sh"), "--verify")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
