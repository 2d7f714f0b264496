package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

const platformIndex = ".spec.platform"

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

// secretHandler enqueues the NativeCCMs whose credentials or image pull
// Secret changed. Helm's own release Secrets live in the same namespace and
// are ignored.
type secretHandler struct{ r *NativeCCMReconciler }

var _ handler.EventHandler = secretHandler{}

func (h secretHandler) Create(ctx context.Context, e event.CreateEvent, q queue) {
	h.enqueue(ctx, q, e.Object)
}

func (h secretHandler) Update(ctx context.Context, e event.UpdateEvent, q queue) {
	h.enqueue(ctx, q, e.ObjectNew)
}

func (h secretHandler) Delete(ctx context.Context, e event.DeleteEvent, q queue) {
	h.enqueue(ctx, q, e.Object)
}

func (h secretHandler) Generic(context.Context, event.GenericEvent, queue) {}

func (h secretHandler) enqueue(ctx context.Context, q queue, o client.Object) {
	s, ok := o.(*corev1.Secret)
	if !ok || s.Namespace != h.r.Namespace || s.Type == release.HelmStorageType {
		return
	}
	var list v1.NativeCCMList
	if err := h.r.List(ctx, &list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "list NativeCCMs for Secret event")
		return
	}
	for i := range list.Items {
		n := &list.Items[i]
		p, _ := h.r.Profiles.Get(n.ProfileName())
		if h.r.secretName(n, p) == s.Name || slices.Contains(h.r.imagePullSecrets(n), s.Name) {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: n.Name}})
		}
	}
}

// podHandler enqueues the NativeCCM of a release pod when the pod appears or
// goes, or when what the health check reads changes: phase, deletion, and per
// container the restart count and state (not every status write).
type podHandler struct{}

var _ handler.EventHandler = podHandler{}

func (podHandler) Create(_ context.Context, e event.CreateEvent, q queue) { enqueuePod(q, e.Object) }

func (podHandler) Update(_ context.Context, e event.UpdateEvent, q queue) {
	oldP, ok1 := e.ObjectOld.(*corev1.Pod)
	newP, ok2 := e.ObjectNew.(*corev1.Pod)
	if !ok1 || !ok2 || podHealth(oldP) == podHealth(newP) {
		return
	}
	enqueuePod(q, newP)
}

func (podHandler) Delete(_ context.Context, e event.DeleteEvent, q queue) { enqueuePod(q, e.Object) }

func (podHandler) Generic(context.Context, event.GenericEvent, queue) {}

// enqueuePod maps a pod labelled hybridccm.io/native-ccm=native-ccm-<name>
// (or a split member's native-ccm-<name>--<value>) to NativeCCM <name>.
func enqueuePod(q queue, o client.Object) {
	if o == nil {
		return
	}
	name, ok := strings.CutPrefix(o.GetLabels()[release.NativeCCMLabel], v1.ReleasePrefix)
	// NativeCCM names contain no "--" (domain.SplitSeparator)
	name, _, _ = strings.Cut(name, domain.SplitSeparator)
	if !ok || name == "" {
		return
	}
	q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
}

// podHealth summarizes what the health check reads from a pod.
func podHealth(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %t", p.Status.Phase, p.DeletionTimestamp.IsZero())
	for _, c := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		state := "waiting"
		switch {
		case c.State.Running != nil:
			state = "running"
		case c.State.Terminated != nil:
			state = "terminated"
		case c.State.Waiting != nil:
			state = "waiting:" + c.State.Waiting.Reason
		}
		fmt.Fprintf(&b, " %s=%d/%s", c.Name, c.RestartCount, state)
	}
	return b.String()
}
