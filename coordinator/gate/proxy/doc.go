// Package proxy is the view half of the gate: ccm-gate, a reverse proxy that a
// native CCM uses as its API server and that shows it only the Nodes of its own
// platform.
//
// It owns the gate's HTTP proxying and nothing else:
//
//   - Node list and watch requests (/api/v1/nodes, /api/v1/watch/nodes[/{name}])
//     get the platform requirement added to their labelSelector, combined with
//     whatever selector the client sent;
//   - every request for one Node (/api/v1/nodes/{name} and all its subpaths) is
//     answered 404 NotFound unless that Node carries the platform label; a DELETE
//     is checked against a fresh read and forwarded with uid and resourceVersion
//     preconditions, so a relabel between the check and the delete fails;
//   - node creation, deletecollection and the legacy /api/v1/proxy/nodes path are
//     refused;
//   - everything else (leases, events, discovery, /healthz, other resources) is
//     forwarded unchanged, and responses are streamed, never buffered.
//
// The proxy adds no privilege: by default it forwards the caller's own
// Authorization and impersonation headers and authenticates with nothing of its
// own. Its own credentials (the pod's ServiceAccount, the same identity as the
// CCM) are used only to keep a cache of the platform's node names.
//
// It must not decide policy beyond the view: what a CCM may change is enforced
// by the API server through the admission policy that coordinator/gate renders
// (the fence). The view narrows what the CCM sees; the fence is the guarantee.
package proxy
