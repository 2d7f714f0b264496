package cleanup

import (
	"context"
	"strings"
	"testing"
)

// TestNativeCCMRefusesNamesThatAreNoLabel: the name goes into label
// selectors, so selector syntax and names too long for a label value are
// refused, naming the argument, before anything is read or deleted (a nil
// client would panic on any call).
func TestNativeCCMRefusesNamesThatAreNoLabel(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"a,owner=helm", `NativeCCM name "a,owner=helm"`},
		{"a in (b)", `NativeCCM name "a in (b)"`},
		{"Upper", `NativeCCM name "Upper"`},
		{strings.Repeat("a", 60), "is no label value"},
		{"", "a NativeCCM name and the coordinator's namespace are required"},
	} {
		_, err := NativeCCM(context.Background(), nil, tc.name, Options{Namespace: "hybrid-ccm-system"})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("name %q: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
