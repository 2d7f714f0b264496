package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// loadBalancers decides which Services a NativeCCM with spec.loadBalancers on
// serves, among all NativeCCMs: a class is served by one NativeCCM only, and
// Services without a class by at most one default. The older NativeCCM
// (creation time, then name) keeps what both ask for; the younger one gets a
// conflict naming the other and does not serve it (without its class it
// serves nothing: no service controller at all). Nil: no load balancers.
func (r *NativeCCMReconciler) loadBalancers(ctx context.Context, obj *v1.NativeCCM) (*release.LoadBalancerSettings, []Conflict, error) {
	if !obj.LoadBalancersEnabled() {
		return nil, nil, nil
	}
	var list v1.NativeCCMList
	if err := r.List(ctx, &list); err != nil {
		return nil, nil, fmt.Errorf("list NativeCCMs: %w", err)
	}
	lb := &release.LoadBalancerSettings{Class: obj.LoadBalancerClass(), Default: obj.Spec.LoadBalancers.Default}
	var conflicts []Conflict
	for i := range list.Items {
		other := &list.Items[i]
		if other.Name == obj.Name || !other.LoadBalancersEnabled() || !other.DeletionTimestamp.IsZero() || !older(other, obj) {
			continue
		}
		if other.LoadBalancerClass() == lb.Class {
			conflicts = append(conflicts, Conflict{v1.LoadBalancerClassConflictReason,
				fmt.Sprintf("NativeCCM %s already serves load balancer class %s: this one serves no load balancers until one of them changes spec.loadBalancers", other.Name, lb.Class)})
			return nil, conflicts, nil
		}
		if lb.Default && other.Spec.LoadBalancers.Default {
			lb.Default = false
			conflicts = append(conflicts, Conflict{v1.LoadBalancerClassConflictReason,
				fmt.Sprintf("NativeCCM %s is already the default for Services of type LoadBalancer without a class: this one serves only class %s", other.Name, obj.LoadBalancerClass())})
		}
	}
	return lb, conflicts, nil
}

// older orders NativeCCMs for load balancer and domain conflicts: creation
// time, then name; the older one keeps what both claim.
func older(a, b *v1.NativeCCM) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// loadBalancerHandler re-reconciles the other NativeCCMs with load balancers
// when one that has (or had) them changes or goes, so that a conflict is
// resolved as soon as its cause is.
type loadBalancerHandler struct{ r *NativeCCMReconciler }

var _ handler.EventHandler = loadBalancerHandler{}

func (h loadBalancerHandler) Create(ctx context.Context, e event.CreateEvent, q queue) {
	h.enqueueOthers(ctx, q, e.Object)
}

func (h loadBalancerHandler) Update(ctx context.Context, e event.UpdateEvent, q queue) {
	o, ok1 := e.ObjectOld.(*v1.NativeCCM)
	n, ok2 := e.ObjectNew.(*v1.NativeCCM)
	if !ok1 || !ok2 || (o.Generation == n.Generation && o.DeletionTimestamp.Equal(n.DeletionTimestamp)) {
		return
	}
	h.enqueueOthers(ctx, q, e.ObjectNew)
	if (o.LoadBalancersEnabled() && !n.LoadBalancersEnabled()) || o.Spec.Platform != n.Spec.Platform {
		h.enqueueOthers(ctx, q, e.ObjectOld)
	}
}

func (h loadBalancerHandler) Delete(ctx context.Context, e event.DeleteEvent, q queue) {
	h.enqueueOthers(ctx, q, e.Object)
}

func (h loadBalancerHandler) Generic(context.Context, event.GenericEvent, queue) {}

func (h loadBalancerHandler) enqueueOthers(ctx context.Context, q queue, o client.Object) {
	changed, ok := o.(*v1.NativeCCM)
	if !ok {
		return
	}
	var list v1.NativeCCMList
	if err := h.r.List(ctx, &list); err != nil {
		return
	}
	for i := range list.Items {
		n := &list.Items[i]
		if n.Name == changed.Name {
			continue
		}
		// the load balancer classes, and the domains of one platform
		// (overlap, unowned nodes), are decided among NativeCCMs
		if (changed.LoadBalancersEnabled() && n.LoadBalancersEnabled()) || n.Spec.Platform == changed.Spec.Platform {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: n.Name}})
		}
	}
}

// holdForLoadBalancers keeps a release that served load balancers while
// Services it served still carry the service controller's cleanup finalizer
// (service.kubernetes.io/load-balancer-cleanup): without the CCM, their
// cloud load balancers would be orphaned and the Services stuck in deletion.
// It returns a wait (Ready False, LoadBalancersRemain, naming the Services)
// until none is left; nil when the release may go.
func (r *NativeCCMReconciler) holdForLoadBalancers(ctx context.Context, obj *v1.NativeCCM) error {
	if obj.Status.Gate == nil || obj.Status.Gate.LoadBalancers == nil {
		return nil
	}
	lb := obj.Status.Gate.LoadBalancers
	var list corev1.ServiceList
	// uncached: read only when a release that served load balancers is to go
	if err := r.APIReader.List(ctx, &list); err != nil {
		return fmt.Errorf("list Services for the load balancers of release %s: %w", obj.ReleaseName(), err)
	}
	var held []string
	for i := range list.Items {
		svc := &list.Items[i]
		if !slices.Contains(svc.Finalizers, gate.LoadBalancerCleanupFinalizer) {
			continue
		}
		class := ptr.Deref(svc.Spec.LoadBalancerClass, "")
		if class == lb.Class || (class == "" && lb.Default) {
			held = append(held, svc.Namespace+"/"+svc.Name)
		}
	}
	if len(held) == 0 {
		return nil
	}
	slices.Sort(held)
	shown := held
	if len(shown) > shownNodes {
		shown = append(slices.Clone(shown[:shownNodes]), "...")
	}
	err := fmt.Errorf("release %s is kept: %d Service(s) it served still carry %s (%s); delete them or change their type, so that the CCM removes their load balancers and the finalizer, and it is uninstalled then",
		obj.ReleaseName(), len(held), gate.LoadBalancerCleanupFinalizer, strings.Join(shown, ", "))
	return r.waitFor(obj, v1.LoadBalancersRemainReason, err)
}
