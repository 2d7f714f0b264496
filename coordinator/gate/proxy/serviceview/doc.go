// Package serviceview is the decision and the emission of the gate's Service
// view: which Services a CCM sees, and what it gets of them.
//
//   - The decision: View (view.go) says which Services a CCM sees, on the
//     facts the object layer (package service) read; History (history.go)
//     follows every Service with the gate's own credentials and remembers
//     when each entered and left the view, so that a watch knows which
//     Services its client holds from before it; WatchState (watch.go)
//     decides what each event of a watch becomes: a Service in the view, a
//     tombstone for one that left it, a bookmark, a Status, or nothing.
//   - The emission (emit.go): the only code that writes Services to the CCM,
//     and only what the decision decided.
//   - The filters (filter.go): a list or a watch read Service by Service,
//     each decided on and written.
//
// What it must not do:
//
//   - serve HTTP: it touches no request or response of the CCM; it reads an
//     io.Reader and writes to the bufio.Writer its caller hands it, and the
//     HTTP layer (package proxy) runs it between the API server's answer and
//     the client, counts, logs and answers errors;
//   - read the wire itself: package service reads Services;
//   - import the HTTP layer or the node view (TestImportRules in
//     coordinator/gate/proxy).
//
// Within the package, the decision (view.go, history.go, watch.go) never
// uses the emission or the filters: a decision is a value (send) that
// emit.go writes.
package serviceview
