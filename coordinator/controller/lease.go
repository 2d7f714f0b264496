package controller

import (
	"context"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// leaseReads are the Leases one reconcile has read from the API server (the
// manager does not cache Leases), so that conflict detection, the release
// step and the health check read a release's Lease once between them.
type leaseReads struct {
	mu   sync.Mutex
	read map[client.ObjectKey]leaseRead
}

type leaseRead struct {
	lease *coordinationv1.Lease
	// found is false for a Lease that does not exist.
	found bool
}

type leaseReadsKey struct{}

// withLeaseReads starts a reconcile's Lease reads.
func withLeaseReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, leaseReadsKey{}, &leaseReads{read: map[client.ObjectKey]leaseRead{}})
}

// getLease reads a Lease through the reconcile's reads: from the API server
// the first time, then as read then (a NotFound error included).
func (r *NativeCCMReconciler) getLease(ctx context.Context, key client.ObjectKey, out *coordinationv1.Lease) error {
	reads, _ := ctx.Value(leaseReadsKey{}).(*leaseReads)
	if reads != nil {
		reads.mu.Lock()
		got, ok := reads.read[key]
		reads.mu.Unlock()
		if ok {
			if !got.found {
				return apierrors.NewNotFound(coordinationv1.Resource("leases"), key.Name)
			}
			got.lease.DeepCopyInto(out)
			return nil
		}
	}
	err := r.APIReader.Get(ctx, key, out)
	if reads != nil && (err == nil || apierrors.IsNotFound(err)) {
		reads.mu.Lock()
		reads.read[key] = leaseRead{lease: out.DeepCopy(), found: err == nil}
		reads.mu.Unlock()
	}
	return err
}

// forgetLeases drops the reconcile's Lease reads: after the coordinator
// wrote a Lease, or after a Helm action (time has passed and the CCM may
// have renewed or taken it).
func forgetLeases(ctx context.Context) {
	if reads, _ := ctx.Value(leaseReadsKey{}).(*leaseReads); reads != nil {
		reads.mu.Lock()
		clear(reads.read)
		reads.mu.Unlock()
	}
}
