package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	"github.com/fluxcd/pkg/runtime/patch"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// waitError is a wait that is not a failure: the reconciler requeues after it.
type waitError struct {
	reason string
	after  time.Duration
	err    error
}

func (w *waitError) Error() string { return w.err.Error() }

// stallError is a configuration error: retrying cannot help until the spec or
// the profiles change.
type stallError struct {
	reason string
	err    error
	// after, when set, looks again then: something outside the spec and the
	// profiles (the API server's version) may change.
	after time.Duration
}

func (s *stallError) Error() string { return s.err.Error() }

// summarize derives Reconciling/Stalled from the outcome, writes the status
// once, and bumps observedGeneration only when the generation was fully handled.
func (r *NativeCCMReconciler) summarize(ctx context.Context, obj *v1.NativeCCM, patcher *patch.SerialPatcher, result ctrl.Result, retErr error) (ctrl.Result, error) {
	var wait *waitError
	var stall *stallError
	done := false
	switch {
	case errors.As(retErr, &stall):
		conditions.MarkStalled(obj, stall.reason, "%s", stall.err)
		conditions.Delete(obj, meta.ReconcilingCondition)
		retErr, done = nil, true
		result = ctrl.Result{RequeueAfter: stall.after}
	case errors.As(retErr, &wait):
		conditions.Delete(obj, meta.StalledCondition)
		conditions.MarkReconciling(obj, meta.ProgressingWithRetryReason, "%s", wait.err)
		result, retErr = ctrl.Result{RequeueAfter: wait.after}, nil
	case retErr != nil:
		conditions.Delete(obj, meta.StalledCondition)
		conditions.MarkReconciling(obj, meta.ProgressingWithRetryReason, "%s", retErr)
	default:
		conditions.Delete(obj, meta.StalledCondition)
		conditions.Delete(obj, meta.ReconcilingCondition)
		done = true
	}
	opts := []patch.Option{patch.WithOwnedConditions{Conditions: owned}, patch.WithFieldOwner(names.CoordinatorController)}
	if done {
		opts = append(opts, patch.WithStatusObservedGeneration{})
	}
	if err := patcher.Patch(ctx, obj, opts...); err != nil {
		if !obj.DeletionTimestamp.IsZero() && apierrors.IsNotFound(err) {
			return result, retErr
		}
		return result, errors.Join(retErr, fmt.Errorf("patch status: %w", err))
	}
	return result, retErr
}

func (r *NativeCCMReconciler) event(obj *v1.NativeCCM, eventType, reason, msg string) {
	if r.EventRecorder != nil {
		r.EventRecorder.Eventf(obj, nil, eventType, reason, "", "%s", msg)
	}
}
