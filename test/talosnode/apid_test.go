package talosnode_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// TestMachineForwards: a client whose endpoint is one machine's apid reads
// another machine's resources; that apid forwards the request to the other
// machine's apid, which answers from its own node.
func TestMachineForwards(t *testing.T) {
	ep := talosnode.StartFor(t)
	addrs := map[string]string{}
	for _, name := range []string{"cp-1", "w-1"} {
		md := runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name}
		if _, err := ep.AddNode(name, []string{"10.1.0." + map[string]string{"cp-1": "1", "w-1": "2"}[name]}, talosnode.Spec{Metadata: &md}); err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[name] = lis.Addr().String()
		go func() { _ = ep.ServeMachine(lis, name) }()
	}
	path := filepath.Join(t.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(path, "os:reader", addrs["cp-1"]); err != nil {
		t.Fatal(err)
	}
	c, err := talos.New(context.Background(), talos.Options{ConfigPath: path, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	for _, target := range []string{"w-1", "10.1.0.2", "cp-1"} {
		md, err := c.PlatformMetadata(ctx, target)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		if want := map[string]string{"w-1": "w-1", "10.1.0.2": "w-1", "cp-1": "cp-1"}[target]; md.Hostname != want {
			t.Fatalf("%s answered as %s", target, md.Hostname)
		}
	}
	if got := ep.Forwarded("cp-1"); got != 2 {
		t.Fatalf("cp-1 forwarded %d requests, want 2", got)
	}
	if got := ep.Node("w-1").Calls(); got != 2 {
		t.Fatalf("w-1's node served %d requests, want 2", got)
	}
	// A fault of the target machine reaches the caller through the hop.
	ep.Node("w-1").SetUnreachable(true, false)
	if _, err := c.PlatformMetadata(ctx, "w-1"); err == nil || !strings.Contains(err.Error(), "no route to host") {
		t.Fatalf("unreachable w-1: %v", err)
	}
	// A machine nobody serves.
	if _, err := c.PlatformMetadata(ctx, "gone"); err == nil || !strings.Contains(err.Error(), "no such host") {
		t.Fatalf("unknown machine: %v", err)
	}
}
