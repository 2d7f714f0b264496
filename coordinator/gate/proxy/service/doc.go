// Package service is the object layer of the gate's Service view: one
// Service as the view reads it from the wire (package wire). It holds
//
//   - the Service (service.go): the facts the view decides on (Facts: name,
//     namespace, uid, resourceVersion, type, class, the load-balancer
//     cleanup finalizer, the initial-events-end annotation), the bytes as
//     the API server sent them, and the edits that write those bytes without
//     spec.loadBalancerClass;
//   - the readers (reader.go), which turn a ServiceList or a watch of the
//     API server into Services and events, one at a time;
//   - the source of the Service history (source.go), which lists and watches
//     all Services with the gate's own credentials through the same readers;
//   - the PUT body with the stored class put back (write.go).
//
// What it must not do:
//
//   - decide what the CCM sees: package serviceview does, on the Facts read
//     here;
//   - write anything to the CCM, or serve HTTP: it hands out Services, and
//     the only writer of Services to the CCM is serviceview's emission;
//   - hold more than one Service (or one event) of a list or a watch in
//     memory, or decode a Service into an object of k8s.io/api: the bytes it
//     copies keep the fields a newer API server adds;
//   - import client-go, or any package of the gate but wire
//     (TestImportRules in coordinator/gate/proxy).
package service
