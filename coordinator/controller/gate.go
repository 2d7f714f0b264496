package controller

import (
	"context"
	"errors"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// reconcileGate puts the gate in place for a release that is wanted, before
// it is installed or upgraded: through the Mutators hook (gate.Coordinator)
// it checks the fence, writes status.gate and returns the mutators that add
// the view (they are part of the release digest). It sets Gated. A gate
// configuration error stalls; anything else is retried, and nothing is
// installed or upgraded until the gate is in place.
func (r *NativeCCMReconciler) reconcileGate(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile, l release.Lifecycle) ([]release.Mutator, error) {
	if r.Mutators == nil {
		return nil, nil
	}
	muts, err := r.Mutators(ctx, obj, p, l)
	switch {
	case errors.Is(err, gate.ErrConfig):
		// only a change of the NativeCCM or its profile can fix it
		return nil, r.stallProfile(obj, v1.InvalidProfileReason, err)
	case err != nil:
		// the fence missing or of another version, or the API server:
		// retried with backoff
		conditions.MarkFalse(obj, meta.ReadyCondition, gate.GateFailedReason, "%s", err)
		r.event(obj, corev1.EventTypeWarning, gate.GateFailedReason, err.Error())
		return nil, err
	}
	return muts, nil
}
