package benchproc

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNodes(t *testing.T) {
	for _, c := range []struct {
		env  string
		want []int
		bad  bool
	}{
		{"", DefaultNodes, false},
		{"1000,5000,10000", []int{1000, 5000, 10000}, false},
		{" 200 , 300", []int{200, 300}, false},
		{"1000,x", nil, true},
		{"0", nil, true},
		{"-5", nil, true},
	} {
		t.Setenv(NodesEnv, c.env)
		got, err := Nodes()
		if (err != nil) != c.bad || !slices.Equal(got, c.want) {
			t.Errorf("%s=%q: got %v, %v; want %v (error %v)", NodesEnv, c.env, got, err, c.want, c.bad)
		}
	}
}

func TestRounds(t *testing.T) {
	for _, c := range []struct {
		env  string
		want int
		bad  bool
	}{
		{"", 5, false},
		{"1", 1, false},
		{" 7 ", 7, false},
		{"4", 0, true}, // no middle round
		{"0", 0, true},
		{"-3", 0, true},
		{"five", 0, true},
	} {
		t.Setenv(RoundsEnv, c.env)
		got, err := Rounds(5)
		if (err != nil) != c.bad || got != c.want || (err != nil && !strings.Contains(err.Error(), RoundsEnv)) {
			t.Errorf("%s=%q: got %d, %v; want %d (error naming %s: %v)", RoundsEnv, c.env, got, err, c.want, RoundsEnv, c.bad)
		}
	}
}

func TestOwnProcess(t *testing.T) {
	pid := os.Getpid()
	if MiB(pid, "RssAnon") <= 0 || MiB(pid, "VmRSS") <= 0 {
		t.Fatalf("no resident memory read for the test process: RssAnon %v VmRSS %v", MiB(pid, "RssAnon"), MiB(pid, "VmRSS"))
	}
	before := CPU(pid)
	// spin until the kernel has charged a tick (10 ms) of CPU time to us
	for end := time.Now().Add(time.Minute); CPU(pid) <= before; {
		if time.Now().After(end) {
			t.Fatalf("CPU time did not grow in a minute of spinning: %v", CPU(pid))
		}
	}
	if MiB(-1, "RssAnon") != 0 || CPU(-1) != 0 {
		t.Fatal("a process that does not exist reads as non-zero")
	}
}

func TestIdle(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep command")
	}
	// A script that runs sleep: Idle starts its binary with no arguments.
	script := filepath.Join(t.TempDir(), "idle")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec "+sleep+" 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := Idle(t.Logf, script, 300*time.Millisecond)
	if err != nil || m.Anon <= 0 {
		t.Fatalf("Idle of a sleeping process: %+v, %v", m, err)
	}
	exits := filepath.Join(t.TempDir(), "exits")
	if err := os.WriteFile(exits, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Idle(t.Logf, exits, 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), exits) {
		t.Fatalf("Idle of a process that exited at once: %v, want an error naming it", err)
	}
	if _, err := Idle(t.Logf, filepath.Join(t.TempDir(), "missing"), time.Millisecond); err == nil {
		t.Fatal("Idle of a missing binary: no error")
	}
}

func TestSaveProfile(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/pprof/heap" {
			http.Error(w, "no such profile", http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte("profile bytes"))
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "heap.pprof")
	if err := SaveProfile(srv.Client(), srv.URL+"/debug/pprof/heap", path); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "profile bytes" {
		t.Fatalf("saved %q, %v", b, err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pprof")
	err := SaveProfile(srv.Client(), srv.URL+"/debug/pprof/nothing", missing)
	if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "no such profile") {
		t.Fatalf("a 404: %v, want an error quoting the answer", err)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Fatal("a failed fetch wrote a file")
	}
}
