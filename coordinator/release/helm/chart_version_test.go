package helm

import (
	"strings"
	"testing"
)

// TestBuiltinChartVersion: a release's coordinator installs the embedded
// native-ccm chart at the release's version (make release VERSION=0.2.0 must
// not leave native-ccm@0.1.0 in the Helm history); a build that is not a
// release keeps the chart's own; a version that is not semver is refused,
// naming it.
func TestBuiltinChartVersion(t *testing.T) {
	own, err := BuiltinChart("")
	if err != nil {
		t.Fatal(err)
	}
	if own.Metadata.Version == "" || own.Metadata.Version == "0.2.0-test.1" {
		t.Fatalf("the chart's own version %q", own.Metadata.Version)
	}
	ch, err := BuiltinChart("0.2.0-test.1")
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != "0.2.0-test.1" || ch.Metadata.AppVersion != "0.2.0-test.1" {
		t.Errorf("version %q appVersion %q, want 0.2.0-test.1 for both", ch.Metadata.Version, ch.Metadata.AppVersion)
	}
	// The stamp is the load's, not the embedded chart's.
	if again, err := BuiltinChart(""); err != nil || again.Metadata.Version != own.Metadata.Version {
		t.Errorf("a later load has version %v (%v), want the chart's own %q", again.Metadata.Version, err, own.Metadata.Version)
	}
	for _, bad := range []string{"devel", "v0.2.0", "0.2", "0.2.0\nname: x"} {
		if _, err := BuiltinChart(bad); err == nil || !strings.Contains(err.Error(), "version") {
			t.Errorf("BuiltinChart(%q): %v, want a refusal naming the version", bad, err)
		}
	}
}
