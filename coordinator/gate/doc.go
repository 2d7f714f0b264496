// Package gate makes a native CCM see and change only its own platform's nodes.
//
// It owns the two halves of the gate as the coordinator deploys them:
//
//   - the fence: a ValidatingAdmissionPolicy + binding per NativeCCM, enforced by
//     the API server itself, that lets the CCM's ServiceAccount update, patch or
//     delete a Node (and nodes/status) only when the Node already carries the
//     CCM's platform label and a providerID with one of the profile's prefixes,
//     and never lets it change that label or the providerID (Fence, Policy,
//     EnsurePolicy, DeletePolicy);
//   - the wiring of the view: a release post-render mutator that adds the
//     ccm-gate sidecar (coordinator/gate/proxy) to the CCM's pod and points the
//     CCM at it through a generated loopback kubeconfig (Sidecar, which also
//     passes the load-balancer class of the Services the CCM serves), and the hook
//     the NativeCCM reconciler calls for every release (Coordinator.Mutators).
//
// It must not run Helm or decide whether a release exists (coordinator/release/helm
// and coordinator/controller do), and it does not proxy HTTP itself
// (coordinator/gate/proxy does).
package gate
