package talos_test

import (
	"context"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// apiMetric reads talos_ccm_talos_api_requests_total{op,code} and the sample
// count of talos_ccm_talos_api_request_duration_seconds{op} from the registry
// talos-ccm serves on /metrics.
func apiMetric(t *testing.T, op, code string) (requests float64, observed uint64) {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			switch mf.GetName() {
			case "talos_ccm_talos_api_requests_total":
				if l["op"] == op && l["code"] == code {
					requests = m.GetCounter().GetValue()
				}
			case "talos_ccm_talos_api_request_duration_seconds":
				if l["op"] == op {
					observed = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return requests, observed
}

// Every Talos API call is counted by operation and gRPC code, and timed.
func TestAPIMetricsCountCallsAndErrors(t *testing.T) {
	ep, c := startEndpoint(t, "")
	ctx := context.Background()
	n, err := ep.AddNode("m1", []string{"10.5.0.1"}, talosnode.Spec{Metadata: &runtime.PlatformMetadataSpec{Platform: "metal", Hostname: "m1"}})
	if err != nil {
		t.Fatal(err)
	}
	const (
		pm  = "talos/Client.PlatformMetadata"
		si  = "talos/Client.SystemInformation"
		nam = "talos/Client.Nodename"
	)
	type key struct{ op, code string }
	keys := []key{{pm, "OK"}, {pm, "Unavailable"}, {pm, "PermissionDenied"}, {si, "NotFound"}, {nam, "OK"}}
	before := map[key]float64{}
	var pmTimed, siTimed uint64
	for _, k := range keys {
		before[k], _ = apiMetric(t, k.op, k.code)
	}
	_, pmTimed = apiMetric(t, pm, "OK")
	_, siTimed = apiMetric(t, si, "OK")

	for range 3 {
		if _, err := c.PlatformMetadata(ctx, "10.5.0.1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.PlatformMetadata(ctx, "10.5.9.9"); err == nil { // no such node
		t.Fatal("unknown node answered")
	}
	n.SetError(status.Error(codes.PermissionDenied, "nope"))
	if _, err := c.PlatformMetadata(ctx, "10.5.0.1"); err == nil {
		t.Fatal("injected error not returned")
	}
	n.SetError(nil)
	if _, err := c.SystemInformation(ctx, "10.5.0.1"); err == nil { // absent resource
		t.Fatal("absent SystemInformation returned")
	}
	if name, err := c.Nodename(ctx, "m1"); err != nil || name != "m1" {
		t.Fatalf("Nodename: %q, %v", name, err)
	}

	want := map[key]float64{{pm, "OK"}: 3, {pm, "Unavailable"}: 1, {pm, "PermissionDenied"}: 1, {si, "NotFound"}: 1, {nam, "OK"}: 1}
	for _, k := range keys {
		got, _ := apiMetric(t, k.op, k.code)
		if got-before[k] != want[k] {
			t.Errorf("talos_ccm_talos_api_requests_total{op=%q,code=%q} grew by %v, want %v", k.op, k.code, got-before[k], want[k])
		}
	}
	if _, timed := apiMetric(t, pm, "OK"); timed-pmTimed != 5 {
		t.Errorf("request_duration_seconds{op=%q} observed %d calls, want 5", pm, timed-pmTimed)
	}
	if _, timed := apiMetric(t, si, "OK"); timed-siTimed != 1 {
		t.Errorf("request_duration_seconds{op=%q} observed %d calls, want 1", si, timed-siTimed)
	}
}
