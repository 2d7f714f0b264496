// Package proxy is the view half of the gate: ccm-gate, a reverse proxy that a
// native CCM uses as its API server and that shows it only the Nodes of its own
// platform.
//
// It owns the gate's HTTP proxying and nothing else (the packages below it
// read the wire and decide; see Packages):
//
//   - Node list and watch requests (/api/v1/nodes, /api/v1/watch/nodes[/{name}])
//     get the platform requirement added to their labelSelector, combined with
//     whatever selector the client sent;
//   - every request for one Node (/api/v1/nodes/{name} and all its subpaths) is
//     answered 404 NotFound unless that Node is in the view. A GET of the Node
//     or its status that prefers JSON or protobuf is asked for in that encoding
//     and answered only when the Node in the API server's answer is in the view
//     (nodeanswer.go); one that prefers any other form (Table,
//     PartialObjectMetadata, YAML, CBOR) is forwarded as asked, without its
//     resourceVersion, and its answer held until reads of the Node before and
//     after it show the Node in the view with the same uid and resourceVersion
//     (nodehold.go: read again on a change, 503 with Retry-After after 3
//     attempts); other reads (HEAD, the proxy subresource) are checked with a
//     fresh read before they are forwarded; a DELETE is checked against a fresh
//     read and forwarded with uid and resourceVersion preconditions, so a
//     relabel between the check and the delete fails;
//   - node creation, deletecollection and the legacy /api/v1/proxy/nodes path are
//     refused;
//   - Services: a CCM sees only those of type LoadBalancer of its
//     load-balancer class (and classless ones when it is the default), and
//     those still carrying the load-balancer cleanup finalizer after their
//     type changed, all without spec.loadBalancerClass, so that the
//     unmodified service controller of k8s.io/cloud-provider serves them.
//     Lists (in one page) and watches are filtered Service by Service at the
//     wire level (JSON and protobuf, never decoded into objects); a watch
//     decides each event on the Service it carries and follows which
//     Services its client holds: one leaving the view is DELETED as a
//     tombstone, one entering it ADDED, nothing else of a Service outside
//     the view is sent; a PUT gets the stored class back. The Service code
//     is layered in packages: wire -> service (object) -> serviceview
//     (decision, emission) -> this one (HTTP). Without a class the CCM sees no
//     Service;
//   - everything else (leases, events, discovery, /healthz, other resources) is
//     forwarded unchanged, and responses are streamed, never buffered (a
//     single Node or Service answer the view checks or holds is read whole
//     first).
//
// What a request costs the API server, besides the request itself: a node
// list or watch, and everything but Nodes and Services, nothing; a Service
// list, watch or GET nothing, a Service write one read of the Service. A GET
// of a Node in JSON or protobuf: nothing when the node cache holds the Node
// in the view, else one read of its metadata (a quorum read); a held GET:
// two reads, and one more read and one more GET per attempt after the first
// (at most 3 GETs and 4 reads); HEAD and the proxy subresource: one read; a
// PATCH or PUT: none when the node cache holds the Node in the view, else
// one read; a DELETE: one read. A checked or held answer is read whole, at
// most 8 MiB; a larger one, or one the gate cannot decode, is a 502 that
// says so. All the checked and held answers the gate holds at once are
// bounded too (24 MiB, until written to the client): beyond that, a read of
// a Node in the view is a 429 with Retry-After (one more read of the Node
// decides), of one outside it the gate's 404.
//
// The proxy adds no privilege: by default it forwards the caller's own
// Authorization and impersonation headers and authenticates with nothing of its
// own. Its own credentials (the pod's ServiceAccount, the same identity as the
// CCM) are used only to keep a cache of the platform's node names and a
// history of when Services entered and left the view.
//
// It must not decide policy beyond the view: what a CCM may change is enforced
// by the API server through the admission policy that coordinator/gate renders
// (the fence). The view narrows what the CCM sees; the fence is the guarantee.
//
// # Packages
//
// The gate's proxy is five packages, layered in one direction: from the
// wire to the views to HTTP.
//
//	wire         the API server's JSON and protobuf at the level of bytes,
//	             and which of the two a Content-Type names
//	service      a Service read from the wire (the object layer): its facts,
//	             the readers of lists and watches, the Service history's
//	             source, a PUT body with its class put back
//	serviceview  which Services the CCM sees and what it gets of them: the
//	             view, the history, a watch's decisions, the emission (the
//	             only writer of Services to the CCM), the filters, and the
//	             encoding of a Service answer
//	nodeview     which Nodes the CCM sees and how a read of one is checked:
//	             the selector, the read checks, a Node's labels in an answer,
//	             the API server's reading of an Accept header
//	proxy        this package, the HTTP layer: the server and its listeners,
//	             routing, the node cache and the reads of a Node or Service,
//	             request bodies and the answers' budget, the checked and held
//	             answers of a Node (nodeanswer.go, nodehold.go), the Service
//	             requests (services.go), and the wiring of the rest
//
// wire imports nothing of the gate; service imports wire; serviceview
// imports service and wire; nodeview imports wire; this package imports them
// all, and none of them imports it. The compiler keeps the direction: a
// package cannot import one that imports it. TestImportRules keeps each
// package to the imports within the module it is meant to have (no sideways
// import between the views, nothing of this package below it), and wire free
// of the Kubernetes API and of HTTP. Each package's doc says what it must not
// do.
package proxy
