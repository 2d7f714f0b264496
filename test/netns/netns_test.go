package netns

import (
	"net"
	"os"
	"strings"
	"testing"
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
