// Package csr is talos-ccm's node-csr-approval controller: it approves a
// kubernetes.io/kubelet-serving CertificateSigningRequest only when the request
// provably belongs to the node that sent it, and denies it with a specific reason
// otherwise. Other signers' requests and requests that already carry a decision are
// never touched. The policy is docs/csr-approval.md.
//
// It owns the decision (Validate, pure and fuzzed) and the recording of it
// (approval subresource, events, metrics, logs). It must not talk to the Talos API
// itself: the addresses talos-ccm established for a node come in through
// NodeFacts, implemented by the one facts source (ccm/facts). It never reads the
// kubelet-written alpha.kubernetes.io/provided-node-ip annotation, nor the node's
// status.addresses, as proof: a kubelet (or whoever holds its credentials) writes
// both itself.
//
// # Wiring (for cmd/talos-ccm)
//
// The contract is as agreed, with these refinements:
//
//   - NewController's recorder may be nil: the controller then creates its own
//     event broadcaster (component "node-csr-approval") and runs it inside Run. opts
//     may be nil (NewOptions()). NewController returns an error if opts.Validate fails.
//   - NewController adds an index to the CSR informer; call it before starting the
//     informer factory, then start the factory, then `go c.Run(ctx)`.
//   - Action's zero value is Ignore, so an empty Decision never approves.
//   - Extra exported helpers: Pending (is this a CSR the controller acts on?),
//     NodeName (system:node:<name> → name), Initialized (no uninitialized taint),
//     the Reason* and EventReason* constants, MaxRequestBytes, names.UninitializedTaint.
//
// Minimal RBAC for the talos-ccm identity (exercised by the integration tests):
//
//	certificates.k8s.io certificatesigningrequests           get list watch
//	certificates.k8s.io certificatesigningrequests/approval  update
//	certificates.k8s.io signers  kubernetes.io/kubelet-serving  approve
//	"" nodes                                                 get list watch
//	"" events (and events.k8s.io events)                     create patch update
//	networking.k8s.io servicecidrs                           list watch
//	in namespace default, resourceNames [kubernetes]:
//	"" services, discovery.k8s.io endpointslices             list watch
//
// A sketch of the wiring:
//
//	opts := csr.NewOptions()
//	opts.AddFlags(fs)
//	...
//	// the facts source forgets deleted nodes (once per process)
//	err := nodeFacts.ForgetDeleted(factory.Core().V1().Nodes().Informer())
//	c, err := csr.NewController(client,
//		factory.Certificates().V1().CertificateSigningRequests(),
//		factory.Core().V1().Nodes(),
//		nodeFacts, nil, opts)
//	factory.Start(ctx.Done())
//	go c.Run(ctx)
package csr
