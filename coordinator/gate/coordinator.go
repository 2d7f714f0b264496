package gate

import (
	"context"
	"fmt"

	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// Reasons of the Gated condition.
const (
	// GateEnforcedReason: the fence is in place and the release carries the view.
	GateEnforcedReason = "GateEnforced"
	// GateFailedReason: the fence could not be written; nothing is installed
	// until it is.
	GateFailedReason = "GateFailed"
)

// Coordinator wires the gate into every release of the NativeCCM reconciler.
// Its Mutators method is a coordinator/controller.MutatorsFunc:
//
//	r.Mutators = gate.Coordinator{Client: mgr.GetClient(), Image: gateImage}.Mutators
type Coordinator struct {
	// Client writes the fence (admissionregistration.k8s.io/v1 policies and
	// bindings).
	Client client.Client
	// Image of ccm-gate.
	Image string
	// ImagePullPolicy of ccm-gate; empty: Kubernetes' default.
	ImagePullPolicy corev1.PullPolicy
}

// Mutators ensures the NativeCCM's fence (owned by the NativeCCM, so it goes
// with it) before the release is installed or upgraded, and returns the
// sidecar mutator that adds the view. It records the Gated condition. Errors
// that wrap ErrConfig need a change of the NativeCCM or profile; others (the
// API server) are worth a retry.
func (g Coordinator) Mutators(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile, l release.Lifecycle) ([]release.Mutator, error) {
	f := Fence{
		NativeCCM:          obj.Name,
		Platform:           obj.Spec.Platform,
		Username:           l.Username(),
		ProviderIDPrefixes: p.ProviderIDPrefixes,
	}
	if obj.UID != "" {
		f.Owner = OwnerReference(obj)
	}
	changed, err := EnsurePolicy(ctx, g.Client, f)
	if err != nil {
		conditions.MarkFalse(obj, v1.GatedCondition, GateFailedReason, "%s", err)
		return nil, err
	}
	if changed {
		ctrl.LoggerFrom(ctx).Info("fence written", "policy", PolicyName(obj.Name), "platform", f.Platform, "user", f.Username)
	}
	s := SidecarFor(l, g.Image)
	s.ImagePullPolicy = g.ImagePullPolicy
	if err := s.validate(); err != nil {
		err = fmt.Errorf("gate sidecar: %w", err)
		conditions.MarkFalse(obj, v1.GatedCondition, GateFailedReason, "%s", err)
		return nil, err
	}
	conditions.MarkTrue(obj, v1.GatedCondition, GateEnforcedReason,
		"admission policy %s lets %s change only nodes labelled %s=%s with providerID %v; ccm-gate shows it only those nodes",
		PolicyName(obj.Name), f.Username, v1.PlatformLabel, f.Platform, f.ProviderIDPrefixes)
	return []release.Mutator{s}, nil
}
