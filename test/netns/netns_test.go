package netns

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m.Run)) }

// TestOnlyLoopback: inside, lo is the only interface, it is up, loopback
// works, and there is no route anywhere else.
func TestOnlyLoopback(t *testing.T) {
	if !Isolated() {
		t.Fatal("not running in the namespace Main made")
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifs) != 1 || ifs[0].Name != "lo" || ifs[0].Flags&net.FlagUp == 0 {
		t.Fatalf("interfaces %+v, want lo, up", ifs)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("loopback: %v", err)
	}
	c.Close()
	routes, err := os.ReadFile("/proc/net/route")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(routes)), "\n"); len(lines) != 1 {
		t.Errorf("IPv4 routes besides the header: %q", lines[1:])
	}
}

// helperEnv selects TestSignalHelper's part in TestReexecPassesSignalsOn;
// its value is the signal the helper handles ("" for none).
const helperEnv = "HYBRIDCCM_NETNS_TEST_HELPER"

// TestReexecPassesSignalsOn starts this test binary again (it re-executes
// itself into a namespace of its own through Main, nested in this one), sends
// a signal to that process only, and checks that the program in the new
// namespace got it and that its exit status comes back: the code it exits
// with when it handles the signal, 128+n when the signal ends it.
func TestReexecPassesSignalsOn(t *testing.T) {
	for _, tc := range []struct {
		name string
		// sig is sent to the process that called Reexec (not its group)
		sig syscall.Signal
		// handle: the program inside handles sig and exits with status 7
		handle bool
		// wantCode is the status of the process that called Reexec
		wantCode int
	}{
		{name: "SIGTERM handled", sig: syscall.SIGTERM, handle: true, wantCode: 7},
		{name: "SIGINT handled", sig: syscall.SIGINT, handle: true, wantCode: 7},
		{name: "SIGHUP ends it", sig: syscall.SIGHUP, wantCode: 128 + int(syscall.SIGHUP)},
		{name: "SIGTERM ends it", sig: syscall.SIGTERM, wantCode: 128 + int(syscall.SIGTERM)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			handled := ""
			if tc.handle {
				handled = tc.sig.String()
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestSignalHelper$")
			cmd.Env = append(os.Environ(), helperEnv+"=helper:"+handled)
			cmd.Stderr = os.Stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			lines := make(chan string)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			next := func(what string) string {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("output ended, want %s", what)
					}
					return l
				case <-time.After(30 * time.Second):
					t.Fatalf("no %s within 30s", what)
				}
				return ""
			}
			// the helper, inside, says in which namespace it runs
			ready := next("line saying ready")
			helperNS, ok := strings.CutPrefix(ready, "ready ")
			if !ok {
				t.Fatalf("helper said %q, want ready <netns>", ready)
			}
			if own := netNamespace(t); helperNS == own {
				t.Errorf("the re-executed program runs in this test's namespace %s", own)
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			if tc.handle {
				if got := next("report from the helper"); got != "got "+tc.sig.String() {
					t.Errorf("helper said %q, want it to have got %v", got, tc.sig)
				}
			}
			for range lines { // until stdout closes
			}
			err = cmd.Wait()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.wantCode {
				t.Errorf("exit status %d, want %d", code, tc.wantCode)
			}
		})
	}
}

// TestSignalHelper is the program TestReexecPassesSignalsOn runs; on its
// own it does nothing.
func TestSignalHelper(t *testing.T) {
	mode, ok := strings.CutPrefix(os.Getenv(helperEnv), "helper:")
	if !ok {
		t.Skip("run by TestReexecPassesSignalsOn")
	}
	got := make(chan os.Signal, 1)
	if mode != "" {
		for _, s := range forwarded {
			if s.String() == mode {
				signal.Notify(got, s)
			}
		}
	}
	fmt.Printf("ready %s\n", netNamespace(t))
	select {
	case s := <-got:
		fmt.Printf("got %s\n", s)
		os.Exit(7)
	case <-time.After(30 * time.Second):
		t.Fatal("no signal within 30s")
	}
}

// netNamespace names this process's network namespace (e.g. net:[4026531840]).
func netNamespace(t *testing.T) string {
	t.Helper()
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}
