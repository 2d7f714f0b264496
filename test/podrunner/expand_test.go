package podrunner

import "testing"

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": "", "B": "$(A)"}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for _, tc := range []struct {
		in   string // command, arg or env value as written in the pod
		want string // what the container gets
	}{
		{in: "plain", want: "plain"},
		{in: "$(A)", want: "a"},
		{in: "x-$(A)-$(A)", want: "x-a-a"},
		{in: "$(EMPTY)", want: ""},
		{in: "$(UNKNOWN)", want: "$(UNKNOWN)"},
		{in: "$$(A)", want: "$(A)"},
		{in: "$$$(A)", want: "$a"},
		{in: "$$", want: "$"},
		{in: "$A", want: "$A"},
		{in: "$", want: "$"},
		{in: "a$", want: "a$"},
		{in: "$(A", want: "$(A"},
		{in: "$()", want: "$()"},
		{in: "$(B)", want: "$(A)"}, // values are not expanded again
	} {
		if got := expand(tc.in, lookup); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
