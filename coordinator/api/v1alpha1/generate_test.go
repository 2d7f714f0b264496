package v1alpha1

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestGeneratedCodeIsFresh regenerates deepcopy code and the CRD with the pinned
// controller-gen into a temporary directory and fails on any difference from the
// files in the tree (hack/coordinator-generate.sh --verify).
func TestGeneratedCodeIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("runs controller-gen")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	cmd := exec.Command("bash", filepath.Join(root, "hack", "coordinator-generate.sh"), "--verify")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
