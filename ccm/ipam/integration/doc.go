// Package integration proves node-ipam-controller against a real kube-apiserver
// and etcd (test/testenv) with simulated Talos nodes (test/talosnode) behind the
// real Talos client: dual-stack range allocation for hundreds of nodes, cloud
// allocation from per-node global IPv6 prefixes, restarts in the middle of
// concurrent node churn, exhaustion and recovery, stale views and foreign
// writes. It has no non-test code. Run with KUBEBUILDER_ASSETS=$(hack/control-plane.sh).
package integration
