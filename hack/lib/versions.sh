# Sourced by the hack/ scripts that build the test cluster's parts and by the
# Makefile: the one place the Kubernetes and etcd versions are defaulted. An
# environment value wins (make test KUBE_VERSION=1.36.3 ETCD_VERSION=3.6.8).
# The AWS CCM's version follows from KUBE_VERSION's minor (hack/aws-ccm.sh reads
# the release profiles/aws.yaml names for it).
KUBE_VERSION="${KUBE_VERSION:-1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-3.7.0}"

# The oldest Kubernetes minor the product supports (docs/install.md, "Supported
# versions"), with the etcd it ships with: `make test-oldest` runs the API-server
# suites against this kube-apiserver (hack/test-oldest.sh).
OLDEST_KUBE_VERSION="${OLDEST_KUBE_VERSION:-1.36.3}"
OLDEST_ETCD_VERSION="${OLDEST_ETCD_VERSION:-3.6.8}"

# CoreDNS of the test cluster's cluster DNS (hack/coredns.sh builds it from
# hack/coredns; test/fleet runs it as Talos deploys it). hack/coredns/go.mod
# requires this version; another one is resolved at build time.
COREDNS_VERSION="${COREDNS_VERSION:-1.15.0}"
