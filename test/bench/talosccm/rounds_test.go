package talosccm

import (
	"strings"
	"testing"
)

func TestBenchRounds(t *testing.T) {
	for _, c := range []struct {
		env     string
		want    int
		wantErr bool
	}{
		{"", defaultRounds, false},
		{"1", 1, false},
		{" 7 ", 7, false},
		{"4", 0, true}, // no middle round
		{"0", 0, true},
		{"-3", 0, true},
		{"five", 0, true},
	} {
		t.Setenv(roundsEnv, c.env)
		got, err := benchRounds()
		if c.wantErr {
			if err == nil || !strings.Contains(err.Error(), roundsEnv) {
				t.Errorf("%s=%q: err %v, want one naming %s", roundsEnv, c.env, err, roundsEnv)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s=%q: %d, %v; want %d", roundsEnv, c.env, got, err, c.want)
		}
	}
}
