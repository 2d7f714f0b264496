// Package ipam is talos-ccm's node-ipam-controller: it gives every node its
// spec.podCIDRs (one CIDR per cluster family), with --allocate-node-cidrs.
//
//   - RangeAllocator hands out the /mask subnets of the cluster CIDRs
//     (--cluster-cidr, or the pod CIDRs of the Talos control plane's
//     k8s/ControllerManagerConfig), skipping the service range.
//   - CloudAllocator carves a node's IPv6 pod CIDR from the node's own global
//     (non-ULA) IPv6 prefix, from its established Talos addresses; IPv4, and IPv6 of
//     nodes without a usable global prefix, come from the cluster CIDRs.
//
// It owns the choice of CIDRs (the ledger of taken CIDRs, the pools, the prefix
// arithmetic) and their recording (the node PATCH, events, metrics, logs). It
// must not talk to the Talos API itself: a node's addresses come from the facts
// talos-ccm established for it (NodeFacts, the one ccm/facts.Source that
// cloud-node and node-csr-approval use too), the control plane's CIDRs through
// ClusterNetworkReader (ccm/talos). The policy and its guarantees are
// docs/ipam.md.
//
// Correctness rests on three things: the ledger is rebuilt from every node's
// spec.podCIDRs before the first allocation; every candidate is checked
// against the ledger exactly (any prefix lengths, both families); and the API
// server is the arbiter of each write (spec.podCIDRs is write-once, the patch
// tests the node's UID, and a failed write adopts what the node really has).
// Exclusive writers across talos-ccm replicas come from leader election;
// overlaps written by anyone else are reported (event CIDROverlap, metric),
// never silently reused.
//
// # Wiring (for cmd/talos-ccm)
//
//	opts := ipam.NewOptions()
//	opts.AddFlags(fss.FlagSet("node-ipam-controller"))
//	...
//	if !kubeCloudShared.AllocateNodeCIDRs { return nil, false, nil }
//	cfg, err := opts.Config(kubeCloudShared.CIDRAllocatorType, kubeCloudShared.ClusterCIDR)
//	err := nodeFacts.ForgetDeleted(factory.Core().V1().Nodes().Informer()) // once per process
//	c, err := ipam.NewController(client, factory.Core().V1().Nodes(), nodeFacts, talosClient, nil, cfg)
//	factory.Start(ctx.Done())
//	go c.Run(ctx)
//
// Minimal RBAC for the talos-ccm identity (exercised by the integration tests):
//
//	"" nodes                                 get list watch patch
//	"" events (and events.k8s.io events)     create patch update
package ipam
