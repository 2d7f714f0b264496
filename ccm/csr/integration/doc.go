// Package integration proves node-csr-approval against a real kube-apiserver and
// etcd (test/testenv): real kubelet-style CSRs submitted under real node identities,
// forged variants, retries, concurrent writers, and a throughput benchmark. It has no
// non-test code. Run with KUBEBUILDER_ASSETS=$(hack/control-plane.sh).
package integration
