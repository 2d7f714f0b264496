// Package wire reads and cuts the API server's JSON and protobuf at the
// level of bytes, without decoding them into objects: the end of a JSON
// value, the members of an object and the elements of an array, a stream of
// consecutive values (json.go); the fields of a protobuf message, the
// Kubernetes envelope of an object ("k8s\x00" Unknown), a stream of fields
// or of watch frames (proto.go); edits that rewrite a buffer while it is
// copied (wire.go); and which of the two encodings a Content-Type names
// (media.go). The Service view (coordinator/gate/proxy/service) reads a
// Service with it, and the node view (coordinator/gate/proxy/nodeview) the
// labels of a Node.
//
// What it must not do:
//
//   - decode or allocate a whole object: it hands out offsets into the
//     caller's bytes and the few strings asked for (a string literal,
//     a field's value), so that reading a list of 5000 Services allocates
//     nothing per Service;
//   - know an object of the API beyond its envelope and ObjectMeta's field
//     numbers: it imports no k8s.io/api, no apimachinery and no client-go
//     (TestImportRules in coordinator/gate/proxy);
//   - import anything of the gate, or of this module;
//   - serve or send HTTP.
//
// # Why it is written by hand
//
// Decoding each Service with apimachinery's codecs (the generated Unmarshal
// of k8s.io/api/core/v1, sigs.k8s.io/json) and encoding it again without its
// class was measured against this reading, and it is slower where the gate's
// 1.15× target is: behind the real binary, in test/bench/gate's
// BenchmarkServiceList5000 with that variant timed in the same rotation
// (GATE_BENCH_CANDIDATE), a list of 5000 Services took 1.27–1.43× (protobuf)
// and 1.54–1.61× (JSON) of the direct list, against 1.09–1.21× and
// 1.02–1.15× with this package; the gate's own work on it, in
// BenchmarkFilterServiceList (coordinator/gate/proxy/serviceview), is 3.6 ms
// against 23.8 ms (protobuf) and 6.9 ms against 148 ms (JSON). Re-encoding
// would also drop every field the gate's k8s.io/api does not know (a newer
// API server's) from what the CCM sees and, through a PUT, from the Service
// itself; copying the bytes keeps them. The figures and how they were taken
// are in docs/gate.md ("The view's code, and decoding with apimachinery
// instead"); FuzzServiceWire holds the reading to client-go's decoding.
package wire
