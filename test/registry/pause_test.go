package registry

import (
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
)

var pauseOnce struct {
	sync.Once
	dir  string
	path string
	err  error
}

// pauseBinary builds the pause program once per test binary.
func pauseBinary(t *testing.T) string {
	t.Helper()
	pauseOnce.Do(func() {
		dir, err := os.MkdirTemp("", "registry-test-pause-")
		if err != nil {
			pauseOnce.err = err
			return
		}
		// removed by TestMain, once every test that shares it is done
		pauseOnce.dir = dir
		pauseOnce.path, pauseOnce.err = BuildPause(t.Context(), dir)
	})
	if pauseOnce.err != nil {
		t.Fatal(pauseOnce.err)
	}
	return pauseOnce.path
}

func TestPauseExitsOnSignal(t *testing.T) {
	bin := pauseBinary(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(bin)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Still there after a while: it waits.
		time.Sleep(200 * time.Millisecond)
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("pause exited on its own: %v", err)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("pause after %s: %v, want exit status 0", sig, err)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("pause still running 10 s after %s", sig)
		}
	}
}

func TestPauseRejectsArguments(t *testing.T) {
	err := exec.Command(pauseBinary(t), "-v").Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("pause -v: %v, want exit status 2", err)
	}
}

// The pause program reaps the children it has: here one it inherits from the
// process it replaced (TestMain's envExecPause), which exits after 2 s.
func TestPauseReapsChildren(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envExecPause+"="+pauseBinary(t))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("pause after SIGTERM: %v", err)
		}
	}()
	pid := cmd.Process.Pid

	// The child appears, exits and is gone; a zombie left behind stays.
	seen := false
	deadline := time.Now().Add(15 * time.Second)
	for {
		kids := children(t, pid)
		if len(kids) > 0 {
			seen = true
		} else if seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("children of pause (pid %d) after 15 s: %v (seen before: %v); want one that exits and is reaped", pid, kids, seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if exe, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe")); err != nil || filepath.Base(exe) != "pause" {
		t.Errorf("pid %d runs %s (%v), want pause", pid, exe, err)
	}
}

// children are the processes whose parent is pid, as "pid state".
func children(t *testing.T, pid int) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid ...; comm may contain spaces and parentheses.
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) >= 2 && fields[1] == strconv.Itoa(pid) {
			out = append(out, e.Name()+" "+fields[0])
		}
	}
	return out
}

// PushPause pushes the pause image where containerd's sandbox_image
// (PauseImage) is pulled from: /pause, its entrypoint, as 65535:65535.
func TestPushPause(t *testing.T) {
	r := start(t)
	ref, err := r.PushPause(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if ref != "registry.k8s.io/pause:3.10" {
		t.Errorf("PushPause = %s", ref)
	}
	stored, err := r.Mirror(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(stored, remote.WithContext(t.Context()), remote.WithTransport(r.HTTPClient().Transport))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/pause" || cf.Config.User != PauseUser {
		t.Errorf("config %+v", cf.Config)
	}
	entries, content := readLayer(t, img, "pause")
	if len(entries) != 1 {
		t.Errorf("layer entries %+v, want only pause", entries)
	}
	// A static executable: ELF without a program interpreter.
	f, err := elf.NewFile(bytes.NewReader(content))
	if err != nil {
		t.Fatalf("/pause: %v", err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("/pause has a program interpreter: not static")
		}
	}
}
