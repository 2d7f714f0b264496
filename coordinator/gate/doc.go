// Package gate makes a native CCM see and change only its own platform's nodes.
//
// It owns the two halves of the gate as the coordinator deploys them:
//
//   - the fence: one ValidatingAdmissionPolicy + binding for all native CCMs of
//     the coordinator's namespace, without parameters, enforced by the API server
//     itself, that lets a native CCM ServiceAccount update, patch or delete a Node
//     (and nodes/status) only when the Node already carries a platform label its
//     grant names and a providerID with one of that platform's prefixes, never
//     lets it change that label or the providerID, and lets one without a grant
//     (no NativeCCM) change nothing (Fence, FenceTemplate, CheckFence,
//     EnsureFence); and the grants, RBAC data the fence asks the authorizer
//     about (Grant, GrantFor, CheckGrant, EnsureGrant);
//   - the wiring of the view: a release post-render mutator that adds the
//     ccm-gate sidecar (coordinator/gate/proxy) to the CCM's pod and points the
//     CCM at it through a generated loopback kubeconfig (Sidecar, which also
//     passes the load-balancer class of the Services the CCM serves), the
//     opt-in NetworkPolicy that leaves the pod only its loopback listeners and
//     lets out only DNS, the API server and the cloud APIs (NetworkPolicy), and
//     the hook the NativeCCM reconciler calls for every release
//     (Coordinator.Mutators).
//
// It must not run Helm or decide whether a release exists (coordinator/release/helm
// and coordinator/controller do), and it does not proxy HTTP itself
// (coordinator/gate/proxy does).
package gate
