package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

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
//
// A gate checked for the same NativeCCM generation, profile prefixes and
// release lifecycle less than Interval ago, and still Gated, is not checked
// again (the check reads the fence and asks the API server a
// SubjectAccessReview per grant): its mutators are reused, unless forced (a
// requested reconcile). The fence itself is enforced by the API server
// whatever the coordinator last checked.
func (r *NativeCCMReconciler) reconcileGate(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile, l release.Lifecycle, forced bool) ([]release.Mutator, error) {
	if r.Mutators == nil {
		return nil, nil
	}
	key := fmt.Sprintf("%d %s %q", obj.Generation, l.Fingerprint(), p.ProviderIDPrefixes)
	if muts, ok := r.gateChecks.get(obj.UID, key, r.now(), r.Interval); ok && !forced &&
		obj.Status.Gate != nil && conditions.IsTrue(obj, v1.GatedCondition) {
		return muts, nil
	}
	r.gateChecks.forget(obj.UID)
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
	r.gateChecks.put(obj.UID, key, r.now(), muts)
	return muts, nil
}

// gateChecks remembers, per NativeCCM, the last gate check that passed.
type gateChecks struct {
	mu   sync.Mutex
	byID map[types.UID]gateCheck
}

type gateCheck struct {
	key  string
	at   time.Time
	muts []release.Mutator
}

func (g *gateChecks) get(id types.UID, key string, now time.Time, ttl time.Duration) ([]release.Mutator, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.byID[id]
	if !ok || c.key != key || now.Sub(c.at) >= ttl || now.Before(c.at) {
		return nil, false
	}
	return c.muts, true
}

func (g *gateChecks) put(id types.UID, key string, now time.Time, muts []release.Mutator) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byID == nil {
		g.byID = map[types.UID]gateCheck{}
	}
	g.byID[id] = gateCheck{key: key, at: now, muts: muts}
}

func (g *gateChecks) forget(id types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.byID, id)
}
