package talosnode_test

import (
	"context"
	"net"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// serveMachine serves machine name's own apid (ServeMachine) on a port of
// its own and returns where it listens.
func serveMachine(t *testing.T, ep *talosnode.Endpoint, name string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ep.ServeMachine(lis, name) }()
	return lis.Addr().String()
}

// apidCredentials are the credentials of a control plane's apid on this
// machine (127.0.0.1).
func apidCredentials(t *testing.T, ep *talosnode.Endpoint) *talosnode.ApidCredentials {
	t.Helper()
	creds, err := ep.ApidCredentials(net.IPv4(127, 0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// serveForwarder serves a control plane's apid of its own (a Forwarder to
// nodes) on a port of its own until the test ends, and returns it and where
// it listens.
func serveForwarder(t *testing.T, creds *talosnode.ApidCredentials, nodes string) (*talosnode.Forwarder, string) {
	t.Helper()
	f, err := talosnode.NewForwarder(creds, nodes)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = f.Serve(lis) }()
	t.Cleanup(f.Stop)
	return f, lis.Addr().String()
}

// readsAs checks that c reads each target's PlatformMetadata, in turn, as
// that of the machine named beside it (target, hostname).
func readsAs(t *testing.T, c *talos.Client, targets [][2]string) {
	t.Helper()
	for _, tw := range targets {
		target, want := tw[0], tw[1]
		md, err := c.PlatformMetadata(context.Background(), target)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		if md.Hostname != want {
			t.Fatalf("%s answered as %s", target, md.Hostname)
		}
	}
}
