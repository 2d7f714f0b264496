package talos_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

func startEndpoint(t *testing.T, role string) (*talosnode.Endpoint, *talos.Client) {
	t.Helper()
	ep := talosnode.StartFor(t)
	path := filepath.Join(t.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(path, role); err != nil {
		t.Fatal(err)
	}
	c, err := talos.New(context.Background(), talos.Options{ConfigPath: path, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return ep, c
}

func TestClientReadsNodeResourcesThroughRouting(t *testing.T) {
	ep, c := startEndpoint(t, "")
	ctx := context.Background()
	_, err := ep.AddNode("web-1", []string{"10.0.0.1", "fd00::1"}, talosnode.Spec{
		Metadata: &runtime.PlatformMetadataSpec{Platform: "aws", Hostname: "web-1", Region: "us-east-1",
			Zone: "us-east-1a", InstanceType: "t3.small", InstanceID: "i-0abc", ProviderID: "aws:///us-east-1a/i-0abc", Spot: true},
		Addresses: []talosnode.Address{{Link: "eth0", Prefix: "10.0.0.1/24"}, {Link: "external", Prefix: "203.0.113.7/32"}},
		System:    &hardware.SystemInformationSpec{Manufacturer: "Amazon EC2", SKUNumber: "sku-1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ep.AddNode("db-1", []string{"10.0.0.2"}, talosnode.Spec{
		Metadata: &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "db-1"},
	}); err != nil {
		t.Fatal(err)
	}

	for _, addr := range []string{"10.0.0.1", "fd00::1"} {
		md, err := c.PlatformMetadata(ctx, addr)
		if err != nil {
			t.Fatalf("PlatformMetadata(%s): %v", addr, err)
		}
		if md.Platform != "aws" || md.InstanceID != "i-0abc" || !md.Spot || md.Zone != "us-east-1a" {
			t.Fatalf("PlatformMetadata(%s) = %+v", addr, md)
		}
	}
	md, err := c.PlatformMetadata(ctx, "10.0.0.2")
	if err != nil || md.Platform != "metal" || md.Hostname != "db-1" {
		t.Fatalf("routing to db-1: %+v, %v", md, err)
	}
	addrs, err := c.Addresses(ctx, "10.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]netip.Prefix{"eth0": netip.MustParsePrefix("10.0.0.1/24"), "external": netip.MustParsePrefix("203.0.113.7/32")}
	if len(addrs) != 2 {
		t.Fatalf("addresses = %+v", addrs)
	}
	for _, a := range addrs {
		if want[a.Link] != a.Prefix {
			t.Fatalf("unexpected address %+v", a)
		}
	}
	si, err := c.SystemInformation(ctx, "10.0.0.1")
	if err != nil || si.SKUNumber != "sku-1" {
		t.Fatalf("SystemInformation = %+v, %v", si, err)
	}
	if _, err := c.SystemInformation(ctx, "10.0.0.2"); !errors.Is(err, talos.ErrNotFound) {
		t.Fatalf("missing SystemInformation: want ErrNotFound, got %v", err)
	}
}

func TestClientFaults(t *testing.T) {
	ep, c := startEndpoint(t, "")
	ctx := context.Background()
	n, err := ep.AddNode("n", []string{"10.1.0.1"}, talosnode.Spec{Metadata: &runtime.PlatformMetadataSpec{Platform: "gcp"}})
	if err != nil {
		t.Fatal(err)
	}
	// unknown node: apid cannot dial it
	if _, err := c.PlatformMetadata(ctx, "10.9.9.9"); status.Code(errors.Unwrap(err)) != codes.Unavailable && !isCode(err, codes.Unavailable) {
		t.Fatalf("unknown node: want Unavailable, got %v", err)
	}
	n.SetUnreachable(true, false)
	if _, err := c.PlatformMetadata(ctx, "10.1.0.1"); !isCode(err, codes.Unavailable) {
		t.Fatalf("unreachable: want Unavailable, got %v", err)
	}
	n.SetUnreachable(true, true)
	if _, err := c.PlatformMetadata(ctx, "10.1.0.1"); !isCode(err, codes.DeadlineExceeded) {
		t.Fatalf("blackhole: want DeadlineExceeded, got %v", err)
	}
	n.SetUnreachable(false, false)
	n.SetError(status.Error(codes.PermissionDenied, "nope"))
	if _, err := c.PlatformMetadata(ctx, "10.1.0.1"); !isCode(err, codes.PermissionDenied) {
		t.Fatalf("injected error: got %v", err)
	}
	n.SetError(nil)
	if _, err := c.PlatformMetadata(ctx, "10.1.0.1"); err != nil {
		t.Fatalf("recovered: %v", err)
	}
}

func TestEndpointRejectsCertificateWithoutRole(t *testing.T) {
	ep, c := startEndpoint(t, "not-a-role")
	if _, err := ep.AddNode("n", []string{"10.2.0.1"}, talosnode.Spec{Metadata: &runtime.PlatformMetadataSpec{Platform: "gcp"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PlatformMetadata(context.Background(), "10.2.0.1"); !isCode(err, codes.PermissionDenied) {
		t.Fatalf("want PermissionDenied, got %v", err)
	}
}

func isCode(err error, code codes.Code) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if s, ok := status.FromError(e); ok && s.Code() == code {
			return true
		}
	}
	return false
}

// Talos renews the certificate in a Talos ServiceAccount's mounted talosconfig:
// a changed file is picked up without a restart.
func TestClientReloadsChangedTalosconfig(t *testing.T) {
	old, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer old.Stop()
	renewed, err := talosnode.Start() // another CA and endpoint: only a reload reaches it
	if err != nil {
		t.Fatal(err)
	}
	defer renewed.Stop()
	for _, ep := range []*talosnode.Endpoint{old, renewed} {
		if _, err := ep.AddNode("n1", []string{"10.3.0.1"}, talosnode.Spec{Metadata: &runtime.PlatformMetadataSpec{Platform: "metal"}}); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "talosconfig")
	if err := old.WriteClientConfig(path, ""); err != nil {
		t.Fatal(err)
	}
	c, err := talos.New(context.Background(), talos.Options{ConfigPath: path, Timeout: 2 * time.Second, ReloadInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.PlatformMetadata(context.Background(), "10.3.0.1"); err != nil || old.Requests() != 1 {
		t.Fatalf("first request: %v (old endpoint saw %d)", err, old.Requests())
	}
	if err := renewed.WriteClientConfig(path, ""); err != nil {
		t.Fatal(err)
	}
	// make the change visible even on filesystems with coarse timestamps
	future := time.Now().Add(time.Minute)
	if err := os.Chtimes(path, future, future); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := c.PlatformMetadata(context.Background(), "10.3.0.1"); err != nil {
		t.Fatalf("after renewal: %v", err)
	}
	if renewed.Requests() != 1 || old.Requests() != 1 {
		t.Fatalf("requests: old %d, renewed %d; want the second on the renewed endpoint", old.Requests(), renewed.Requests())
	}
	// a broken file keeps the working client
	if err := os.WriteFile(path, []byte("not: [a talosconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, future.Add(time.Minute), future.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := c.PlatformMetadata(context.Background(), "10.3.0.1"); err != nil {
		t.Fatalf("after a broken file: %v", err)
	}
}
