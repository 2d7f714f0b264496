// Package nodeview is the decision of the gate's node view: which Nodes a
// CCM sees, and how a read of one Node is checked.
//
//   - selector.go: the view's label requirements (the platform label and
//     the domain selector's), and a list or watch query with them added to
//     the client's labelSelector;
//   - check.go: how a read of one Node is checked (ReadCheckOf): by a read
//     of the Node before it is forwarded, by the Node in the answer (Labels
//     reads its labels from a JSON or protobuf answer), or by holding the
//     answer until reads of the Node before and after it agree;
//   - accept.go: whether the API server answers a GET of a Node as a plain
//     object in JSON or protobuf, and in which, reading the Accept header as
//     the API server does (plainPreferred).
//
// What it must not do:
//
//   - serve or send HTTP: the HTTP layer (package proxy: nodeanswer.go,
//     nodehold.go, lookup.go) forwards the requests, reads the Nodes, holds
//     the answers and writes them, on what is decided here;
//   - decide anything about Services, or import the Service view or the
//     HTTP layer;
//   - import client-go (TestImportRules in coordinator/gate/proxy).
package nodeview
