package facts_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/reach"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
)

// blockedReader is a TalosReader whose every request waits for release, then
// fails as apid's forwarding to an unreachable node does.
type blockedReader struct {
	started chan struct{}
	release chan struct{}
}

func (b *blockedReader) fail(ctx context.Context, op, node string) error {
	select {
	case b.started <- struct{}{}:
	default:
	}
	<-b.release
	return &talos.CallError{Op: op, Node: node, Endpoint: "10.0.0.1:50000",
		Err: status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 10.92.0.1:50000: connect: connection refused\"")}
}

func (b *blockedReader) PlatformMetadata(ctx context.Context, n string) (*talos.PlatformMetadata, error) {
	return nil, b.fail(ctx, "md", n)
}
func (b *blockedReader) Addresses(ctx context.Context, n string) ([]talos.Address, error) {
	return nil, b.fail(ctx, "addr", n)
}
func (b *blockedReader) Links(ctx context.Context, n string) ([]talos.Link, error) {
	return nil, b.fail(ctx, "links", n)
}
func (b *blockedReader) SystemInformation(ctx context.Context, n string) (*talos.SystemInformation, error) {
	return nil, b.fail(ctx, "sys", n)
}
func (b *blockedReader) Nodename(ctx context.Context, n string) (string, error) {
	return "", b.fail(ctx, "name", n)
}

// TestReviewDeletedDuringLookupIsNotReportedUnreachable: a node deleted while
// a lookup of it is in flight (a node that is down, whose lookup waits for its
// timeout, is the one that gets deleted) must not stay in the Reporter, nor in
// talos_ccm_talos_api_unreachable_nodes, after the lookup ends: no delete event
// comes again to take it out, and TalosAPIUnreachable fires forever.
func TestReviewDeletedDuringLookupIsNotReportedUnreachable(t *testing.T) {
	rd := &blockedReader{started: make(chan struct{}, 1), release: make(chan struct{})}
	rep := reach.New(reach.Options{})
	p := facts.NewSource(rd, cloud.NewInterpreter(nil), facts.Options{LookupTimeout: time.Minute, Observer: rep})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gone-1",
		Annotations: map[string]string{cloudproviderapi.AnnotationAlphaProvidedIPAddr: "10.92.0.1"}}}
	done := make(chan error, 1)
	go func() { _, err := p.Facts(context.Background(), node); done <- err }()
	<-rd.started
	p.Deleted(node.Name) // the informer's delete event (the handler ForgetDeleted registers)
	close(rd.release)
	if err := <-done; !errors.Is(err, facts.ErrTalosAPI) {
		t.Fatalf("lookup: %v, want ErrTalosAPI", err)
	}
	if n := rep.Nodes(); len(n) != 0 {
		t.Fatalf("after the node was deleted the Reporter still counts it unreachable: %v", n)
	}
}
