package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/controller"
)

// Checks of the product's own controllers.
const (
	CheckTalosCCMMissing   = "TalosCCMNotInstalled"
	CheckControllerNotUp   = "ControllerNotReady"
	CheckNoLeader          = "ControllerWithoutLeader"
	CheckCoordinatorAbsent = "CoordinatorNotInstalled"
)

// installHint says how to install a missing controller, whatever way the
// rest was installed.
const installHint = "install it: helm install hybrid-ccm oci://ghcr.io/hybrid-ccm/charts/hybrid-ccm -n kube-system " +
	"(or helm upgrade of your release, or the Flux HelmRelease of gitops/), " +
	"or kubectl apply --server-side -f docs/deploy/%s.yaml (docs/install.md)"

// controllerRef is a Deployment of one of the product's controllers.
type controllerRef struct{ namespace, name string }

func (d controllerRef) logs() string {
	return fmt.Sprintf("kubectl -n %s logs deploy/%s", d.namespace, d.name)
}

// controllerChecks say which controllers checkControllers looks for.
type controllerChecks struct {
	talosCCM, coordinator bool
	// where the Deployments were listed, for the finding of a missing one:
	// "" (everywhere) or "in namespace <ns>"
	where string
}

// checkControllers finds talos-ccm (by what its container runs, however it
// was installed) and ccm-coordinator (by its chart's name label) and
// reports either when it is missing, has no ready replica, or no replica
// holds its leader-election Lease. It remembers the coordinator, whose logs
// other findings point to.
func (r *Report) checkControllers(ctx context.Context, c client.Client, o Options, deps []appsv1.Deployment, which controllerChecks) error {
	talos := 0
	for i := range deps {
		d := &deps[i]
		ref := controllerRef{d.Namespace, d.Name}
		for _, ct := range d.Spec.Template.Spec.Containers {
			w, ok := controller.ParseCCMContainer("Deployment/"+d.Namespace+"/"+d.Name, ct)
			if !ok || !w.IsTalosCCM() || !which.talosCCM {
				continue
			}
			talos++
			if !r.checkReady(d, "talos-ccm", "no node is initialized and no serving certificate approved until one is") {
				continue
			}
			if w.LeaderElect {
				if err := r.checkLease(ctx, c, o, "talos-ccm", ref, w.LeaseNamespace, w.LeaseName); err != nil {
					return err
				}
			}
		}
		if which.coordinator && d.Labels["app.kubernetes.io/name"] == "ccm-coordinator" {
			r.coordinator = &ref
			if r.checkReady(d, "ccm-coordinator", "no NativeCCM is reconciled until one is") {
				if err := r.checkLease(ctx, c, o, "ccm-coordinator", ref, d.Namespace, names.CoordinatorLease); err != nil {
					return err
				}
			}
		}
	}
	if which.talosCCM && talos == 0 {
		r.add(CheckTalosCCMMissing, "deployment/talos-ccm", fmt.Sprintf(installHint, "talos-ccm"),
			"no Deployment %sruns talos-ccm (--cloud-provider=talos): nodes registering with the uninitialized taint stay tainted", which.where)
	}
	return nil
}

// checkReady reports a Deployment of the product with no ready replica; it
// says whether one is ready.
func (r *Report) checkReady(d *appsv1.Deployment, what, consequence string) bool {
	if d.Status.ReadyReplicas > 0 {
		return true
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	ref := controllerRef{d.Namespace, d.Name}
	if want == 0 {
		r.add(CheckControllerNotUp, "deployment/"+d.Namespace+"/"+d.Name,
			fmt.Sprintf("kubectl -n %s scale deploy/%s --replicas=1 (or helm upgrade with the release's values)", d.Namespace, d.Name),
			"%s: scaled to 0 replicas: %s", what, consequence)
		return false
	}
	r.add(CheckControllerNotUp, "deployment/"+d.Namespace+"/"+d.Name,
		fmt.Sprintf("kubectl -n %s describe deploy/%s (events: scheduling, image pulls), then %s", d.Namespace, d.Name, ref.logs()),
		"%s: 0 of %d replicas ready: %s", what, want, consequence)
	return false
}

// checkLease reports a controller whose leader-election Lease is missing,
// has no holder, or was not renewed within its duration: its replicas run
// but none leads.
func (r *Report) checkLease(ctx context.Context, c client.Client, o Options, what string, d controllerRef, ns, name string) error {
	var l coordinationv1.Lease
	obj := "lease/" + ns + "/" + name
	fix := d.logs() + " (a replica that cannot reach the API server, or may not update this Lease, cannot lead)"
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &l); err != nil {
		if apierrors.IsNotFound(err) {
			r.add(CheckNoLeader, obj, fix, "%s has ready replicas but its leader-election Lease does not exist: none leads", what)
			return nil
		}
		return fmt.Errorf("get %s: %w", obj, err)
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = strings.TrimSpace(*l.Spec.HolderIdentity)
	}
	switch {
	case holder == "":
		r.add(CheckNoLeader, obj, fix, "%s has ready replicas but its leader-election Lease has no holder: none leads", what)
	case l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil:
		expired := l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
		if o.Now.After(expired) {
			r.add(CheckNoLeader, obj, fix, "%s's leader-election Lease, held by %s, expired %s ago without renewal: its leader is gone or stuck",
				what, holder, o.Now.Sub(expired).Truncate(time.Second))
		}
	}
	return nil
}

// coordinatorLogs is the fix line that points to the coordinator's logs,
// wherever and however it was installed.
func (r *Report) coordinatorLogs() string {
	if r.coordinator == nil {
		return "no ccm-coordinator Deployment (label app.kubernetes.io/name=ccm-coordinator) found: " + fmt.Sprintf(installHint, "ccm-coordinator")
	}
	return "check ccm-coordinator is running: " + r.coordinator.logs()
}
