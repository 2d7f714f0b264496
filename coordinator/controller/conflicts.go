package controller

import (
	"context"
	"fmt"
	"strings"

	"github.com/fluxcd/pkg/runtime/conditions"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// Defaults of every CCM built on k8s.io/cloud-provider.
const (
	defaultLeaseName      = "cloud-controller-manager"
	defaultLeaseNamespace = "kube-system"
)

// Conflict is one problem found in the cluster around a NativeCCM.
type Conflict struct {
	// Reason is a v1alpha1 conflict reason.
	Reason string
	// Message names the object at fault.
	Message string
}

// CCMWorkload is what conflict detection reads from a Deployment or DaemonSet
// container that looks like a cloud-controller-manager.
type CCMWorkload struct {
	// Ref is kind/namespace/name.
	Ref string
	// Controllers is the --controllers value ("*" when absent).
	Controllers []string
	// LeaseName and LeaseNamespace are the leader-election lease it uses.
	LeaseName, LeaseNamespace string
	// LeaderElect is false with --leader-elect=false.
	LeaderElect bool
	// Provider is the --cloud-provider value.
	Provider string
	// Image is the container image.
	Image string
}

// TalosCCMProvider is talos-ccm's --cloud-provider: the one CCM that is meant
// to run cloud-node in a Hybrid CCM cluster.
const TalosCCMProvider = "talos"

// IsTalosCCM reports whether the workload is talos-ccm itself.
func (w CCMWorkload) IsTalosCCM() bool {
	return w.Provider == TalosCCMProvider || strings.Contains(w.Image, "talos-ccm") ||
		strings.Contains(w.Image, "talos-cloud-controller-manager")
}

// RunsCloudNode reports whether the CCM runs the cloud-node controller.
func (w CCMWorkload) RunsCloudNode() bool {
	for _, c := range w.Controllers {
		if c == "*" || c == "cloud-node" {
			return true
		}
	}
	return false
}

// ParseCCMContainer recognises a cloud-controller-manager container by its
// flags (--cloud-provider) or image name and extracts controllers and lease.
func ParseCCMContainer(ref string, c corev1.Container) (CCMWorkload, bool) {
	args := append(append([]string{}, c.Command...), c.Args...)
	flags := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, value, ok := strings.Cut(a, "=")
		name = "--" + strings.TrimLeft(name, "-")
		if !ok && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			value = args[i+1]
			i++
		}
		flags[name] = value
	}
	_, hasProvider := flags["--cloud-provider"]
	if !hasProvider && !strings.Contains(c.Image, "cloud-controller-manager") {
		return CCMWorkload{}, false
	}
	w := CCMWorkload{
		Ref:            ref,
		Controllers:    []string{"*"},
		LeaseName:      defaultLeaseName,
		LeaseNamespace: defaultLeaseNamespace,
		LeaderElect:    flags["--leader-elect"] != "false",
		Provider:       flags["--cloud-provider"],
		Image:          c.Image,
	}
	if v, ok := flags["--controllers"]; ok {
		w.Controllers = strings.Split(v, ",")
	}
	if v := flags["--leader-elect-resource-name"]; v != "" {
		w.LeaseName = v
	}
	if v := flags["--leader-elect-resource-namespace"]; v != "" {
		w.LeaseNamespace = v
	}
	return w, true
}

// detectConflicts sets the Conflict condition and emits an event when the set
// of conflicts changes.
func (r *NativeCCMReconciler) detectConflicts(ctx context.Context, obj *v1.NativeCCM, nodes platformView) error {
	found, err := r.findConflicts(ctx, obj, nodes)
	if err != nil {
		return err
	}
	if len(found) == 0 {
		conditions.MarkFalse(obj, v1.ConflictCondition, v1.NoConflictReason, "no conflicting CCM, lease or node found")
		return nil
	}
	msgs := make([]string, len(found))
	for i, c := range found {
		msgs[i] = c.Message
	}
	msg := strings.Join(msgs, "; ")
	prev := conditions.Get(obj, v1.ConflictCondition)
	if prev == nil || prev.Status != "True" || prev.Message != msg {
		for _, c := range found {
			r.event(obj, corev1.EventTypeWarning, c.Reason, c.Message)
		}
	}
	conditions.MarkTrue(obj, v1.ConflictCondition, found[0].Reason, "%s", msg)
	return nil
}

func (r *NativeCCMReconciler) findConflicts(ctx context.Context, obj *v1.NativeCCM, nodes platformView) ([]Conflict, error) {
	var out []Conflict
	lease := obj.ReleaseName()

	// Our lease held by someone who is not our Deployment's pod.
	var l coordinationv1.Lease
	err := r.getLease(ctx, client.ObjectKey{Namespace: r.Namespace, Name: lease}, &l)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("get lease %s/%s: %w", r.Namespace, lease, err)
	default:
		if h := l.Spec.HolderIdentity; h != nil && *h != "" && !strings.HasPrefix(*h, lease+"-") {
			out = append(out, Conflict{v1.LeaseNameSharedReason, fmt.Sprintf("lease %s/%s is held by %q, which is not this release's pod", r.Namespace, lease, *h)})
		}
	}

	workloads, err := r.foreignCCMs(ctx)
	if err != nil {
		return nil, err
	}
	for _, w := range workloads {
		if w.LeaderElect && w.LeaseName == lease && w.LeaseNamespace == r.Namespace {
			out = append(out, Conflict{v1.LeaseNameSharedReason, fmt.Sprintf("%s uses lease %s/%s too", w.Ref, w.LeaseNamespace, w.LeaseName)})
		}
	}
	for _, w := range workloads {
		if w.RunsCloudNode() && !w.IsTalosCCM() {
			out = append(out, Conflict{v1.ForeignCloudNodeControllerReason, fmt.Sprintf("%s (not managed by ccm-coordinator) runs the cloud-node controller (--controllers=%s)", w.Ref, strings.Join(w.Controllers, ","))})
		}
	}

	out = append(out, r.previousCCMConflict(ctx, obj)...)

	_, lbConflicts, err := r.loadBalancers(ctx, obj)
	if err != nil {
		return nil, err
	}
	out = append(out, lbConflicts...)

	if nodes.WithoutProviderID > 0 {
		out = append(out, Conflict{v1.EmptyProviderIDReason, fmt.Sprintf("%d node(s) of platform %s have no providerID: %s", nodes.WithoutProviderID, obj.Spec.Platform, strings.Join(nodes.FirstWithoutProviderID, ", "))})
	}
	return out, nil
}

// foreignCCMs lists CCM containers in Deployments and DaemonSets not labelled
// as ours.
func (r *NativeCCMReconciler) foreignCCMs(ctx context.Context) ([]CCMWorkload, error) {
	var out []CCMWorkload
	add := func(kind string, o client.Object, spec corev1.PodSpec) {
		if o.GetLabels()[release.ManagedByLabel] == release.ManagedByValue {
			return
		}
		for _, c := range spec.Containers {
			if w, ok := ParseCCMContainer(kind+"/"+o.GetNamespace()+"/"+o.GetName(), c); ok {
				out = append(out, w)
			}
		}
	}
	var deps appsv1.DeploymentList
	if err := r.List(ctx, &deps); err != nil {
		return nil, fmt.Errorf("list deployments: %w", err)
	}
	for i := range deps.Items {
		add("Deployment", &deps.Items[i], deps.Items[i].Spec.Template.Spec)
	}
	var dss appsv1.DaemonSetList
	if err := r.List(ctx, &dss); err != nil {
		return nil, fmt.Errorf("list daemonsets: %w", err)
	}
	for i := range dss.Items {
		add("DaemonSet", &dss.Items[i], dss.Items[i].Spec.Template.Spec)
	}
	return out, nil
}
