package testenv_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// TestExecGivesTheCallersGOGC: hack/test.sh gives the Go toolchain its own
// GOGC (BUILD_GOGC) and records the caller's; hack/lib/test-exec.sh, go
// test's -exec, must run every test binary with the caller's GOGC (set, set
// to empty, or unset) and leave no trace of the recording.
func TestExecGivesTheCallersGOGC(t *testing.T) {
	script := filepath.Join(testenv.RepoRoot(), "hack", "lib", "test-exec.sh")
	for _, tc := range []struct {
		name   string
		caller []string // what hack/test.sh exports for the caller's GOGC
		want   string   // GOGC's line in the binary's environment, "" for none
	}{
		{"caller set 50", []string{"HYBRID_CCM_CALLER_GOGC=50", "HYBRID_CCM_CALLER_GOGC_SET=set"}, "GOGC=50"},
		{"caller set off", []string{"HYBRID_CCM_CALLER_GOGC=off", "HYBRID_CCM_CALLER_GOGC_SET=set"}, "GOGC=off"},
		{"caller set empty", []string{"HYBRID_CCM_CALLER_GOGC=", "HYBRID_CCM_CALLER_GOGC_SET=set"}, "GOGC="},
		{"caller unset", []string{"HYBRID_CCM_CALLER_GOGC=", "HYBRID_CCM_CALLER_GOGC_SET="}, ""},
		{"not through hack/test.sh", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("bash", script, "env")
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "GOGC=400"}, tc.caller...)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s env: %v", script, err)
			}
			var gogc []string
			for line := range strings.Lines(string(out)) {
				line = strings.TrimSuffix(line, "\n")
				if strings.HasPrefix(line, "GOGC=") {
					gogc = append(gogc, line)
				}
				if strings.HasPrefix(line, "HYBRID_CCM_CALLER_GOGC") {
					t.Errorf("the test binary sees %s", line)
				}
			}
			switch {
			case tc.want == "" && len(gogc) > 0:
				t.Errorf("the test binary sees %v, want no GOGC (the toolchain's 400 left behind)", gogc)
			case tc.want != "" && (len(gogc) != 1 || gogc[0] != tc.want):
				t.Errorf("the test binary sees %v, want %s", gogc, tc.want)
			}
		})
	}
}
