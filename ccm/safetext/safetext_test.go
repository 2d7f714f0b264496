package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"connection refused", 100, "connection refused"},
		{"a\r\nb\x1b[2Kc\u202ed\u2028e\x00f", 100, "ab[2Kcdef"},
		{"bad \xff utf8", 100, "bad  utf8"},
		{"abcdef", 3, "abc…"},
		{"aé", 2, "a…"}, // é is two bytes: the cut moves back to its start
		{"", 0, ""},
	} {
		if got := Clip(tc.in, tc.n); got != tc.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func FuzzClip(f *testing.F) {
	f.Add("x\x1b]8;;http://evil\x07y", 10)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		got := Clip(s, n)
		body := strings.TrimSuffix(got, "…")
		if len(body) > n || !utf8.ValidString(got) || strings.ContainsAny(body, "\r\n\x1b\x00\u202e") {
			t.Fatalf("Clip(%q, %d) = %q", s, n, got)
		}
	})
}
