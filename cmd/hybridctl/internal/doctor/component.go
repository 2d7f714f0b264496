package doctor

import (
	"context"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Components doctor can be scoped to (Options.Component): what one chart
// installed, checked with what its helm test's ServiceAccount may read.
const (
	// ComponentTalosCCM: the nodes (uninitialized, without the platform
	// label or a providerID, overlapping pod CIDRs), the talos-ccm
	// Deployment of the namespace (a ready replica, a leader) and the
	// kubelet-serving CSRs.
	ComponentTalosCCM = "talos-ccm"
	// ComponentCoordinator: the ccm-coordinator Deployment of the namespace
	// (a ready replica, a leader), the fence, and the NativeCCMs (Ready,
	// their CCMs running, load balancer classes, version skew).
	ComponentCoordinator = "ccm-coordinator"
)

// Components are the values of Options.Component.
var Components = []string{ComponentTalosCCM, ComponentCoordinator}

// runComponent runs the checks of o.Component, reading only what its
// chart's test ServiceAccount may: the namespace's Deployments and the
// controller's Lease there, and cluster-wide what its checks name above.
func (r *Report) runComponent(ctx context.Context, c client.Client, o Options) error {
	if !slices.Contains(Components, o.Component) {
		return fmt.Errorf("component %q: want one of %v", o.Component, Components)
	}
	if o.Namespace == "" {
		return fmt.Errorf("component %s: the namespace of its controller is required", o.Component)
	}
	var deps appsv1.DeploymentList
	if err := c.List(ctx, &deps, client.InNamespace(o.Namespace)); err != nil {
		return fmt.Errorf("list deployments of %s: %w", o.Namespace, err)
	}
	where := "in namespace " + o.Namespace + " "
	switch o.Component {
	case ComponentTalosCCM:
		var nodes corev1.NodeList
		if err := c.List(ctx, &nodes); err != nil {
			return fmt.Errorf("list nodes: %w", err)
		}
		r.Inspected.Nodes = len(nodes.Items)
		r.checkNodes(nodes.Items, o)
		r.checkPodCIDRs(nodes.Items)
		if err := r.checkControllers(ctx, c, o, deps.Items, controllerChecks{talosCCM: true, where: where}); err != nil {
			return err
		}
		return r.checkCSRs(ctx, c, o)
	default: // ComponentCoordinator
		if err := r.checkControllers(ctx, c, o, deps.Items, controllerChecks{coordinator: true, where: where}); err != nil {
			return err
		}
		if r.coordinator == nil {
			r.add(CheckCoordinatorAbsent, "deployment/"+o.Namespace+"/ccm-coordinator", fmt.Sprintf(installHint, "ccm-coordinator"),
				"no Deployment %swith the label app.kubernetes.io/name=ccm-coordinator: no NativeCCM is installed, upgraded or removed", where)
		}
		return r.checkNativeCCMs(ctx, c, nil, false)
	}
}
