package talosnode_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

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
		addrs[name] = serveMachine(t, ep, name)
	}
	c := ep.ClientAs(t, "os:reader", addrs["cp-1"])
	readsAs(t, c, [][2]string{{"w-1", "w-1"}, {"10.1.0.2", "w-1"}, {"cp-1", "cp-1"}})
	if got := ep.Forwarded("cp-1"); got != 2 {
		t.Fatalf("cp-1 forwarded %d requests, want 2", got)
	}
	if got := ep.Node("w-1").Calls(); got != 2 {
		t.Fatalf("w-1's node served %d requests, want 2", got)
	}
	// The second hop is apid's own certificate (os:impersonator): w-1's
	// apid saw both forwarded requests as such, and only those.
	if got := ep.ViaApid(); got != 2 {
		t.Fatalf("the machines received %d requests from an apid (os:impersonator), want 2", got)
	}
	// A caller without a Talos role is refused by cp-1's apid before any
	// forward: w-1 hears nothing of it.
	ctx := context.Background()
	c2 := ep.ClientAs(t, "os:nobody", addrs["cp-1"])
	if _, err := c2.PlatformMetadata(ctx, "w-1"); err == nil || !strings.Contains(err.Error(), "not allowed") {
		t.Fatalf("a certificate without a Talos role: %v", err)
	}
	if got, calls, via := ep.Forwarded("cp-1"), ep.Node("w-1").Calls(), ep.ViaApid(); got != 2 || calls != 2 || via != 2 {
		t.Fatalf("after a refused request cp-1 forwarded %d, w-1 served %d, the machines received %d from an apid; want 2, 2, 2", got, calls, via)
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

// TestForwarder: a control plane's apid in a process of its own (here a
// Forwarder beside the endpoint) forwards every request to the machine it
// names, over a connection per machine, and the machines see each request
// as forwarded.
func TestForwarder(t *testing.T) {
	ep := talosnode.StartFor(t)
	for i, name := range []string{"w-1", "w-2"} {
		md := runtime.PlatformMetadataSpec{Platform: "metal", Hostname: name}
		if _, err := ep.AddNode(name, []string{"10.2.0." + string(rune('1'+i))}, talosnode.Spec{Metadata: &md}); err != nil {
			t.Fatal(err)
		}
	}
	credsPath := filepath.Join(t.TempDir(), "apid.json")
	if err := apidCredentials(t, ep).WriteFile(credsPath); err != nil {
		t.Fatal(err)
	}
	creds, err := talosnode.ReadApidCredentials(credsPath)
	if err != nil {
		t.Fatal(err)
	}
	f, addr := serveForwarder(t, creds, ep.Addr())
	c := ep.ClientAs(t, "os:reader", addr)
	readsAs(t, c, [][2]string{{"w-1", "w-1"}, {"10.2.0.2", "w-2"}, {"w-1", "w-1"}})
	if got := f.Forwarded(); got != 3 {
		t.Fatalf("forwarded %d requests, want 3", got)
	}
	if got, all := ep.ViaApid(), ep.Requests(); got != 3 || all != 3 {
		t.Fatalf("the machines received %d requests, %d forwarded; want 3, 3", all, got)
	}
	// A machine nobody serves: the machines' apid says so through the hop.
	ctx := context.Background()
	if _, err := c.PlatformMetadata(ctx, "gone"); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("unknown machine: %v", err)
	}
	// A client without a Talos role is refused by the forwarding apid.
	c2 := ep.ClientAs(t, "os:nobody", addr)
	if _, err := c2.PlatformMetadata(ctx, "w-1"); err == nil || !strings.Contains(err.Error(), "not allowed") {
		t.Fatalf("a certificate without a Talos role: %v", err)
	}
	if got := f.Forwarded(); got != 4 {
		t.Fatalf("forwarded %d requests after the refusal, want 4 (the unknown machine's counted, the refused not)", got)
	}
}
