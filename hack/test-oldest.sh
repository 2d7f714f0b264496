#!/usr/bin/env bash
# make test-oldest: the suites that need only an API server (node
# initialization, CSR approval, IPAM, the coordinator with its gate and fence,
# the binaries against their chart RBAC, hybridctl) against the oldest
# supported minor's kube-apiserver (OLDEST_KUBE_VERSION, hack/lib/versions.sh),
# built and cached like make test's. make test runs them at KUBE_VERSION; the
# two together are the supported range docs/install.md states.
#
#   go test flags: GO_TEST_FLAGS (e.g. -run TestX)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/lib/versions.sh"
assets="$(KUBE_VERSION="${OLDEST_KUBE_VERSION}" ETCD_VERSION="${OLDEST_ETCD_VERSION}" "${here}/control-plane.sh")"
"${assets}/kube-apiserver" --version >&2
# Node initialization, CSR approval and IPAM (ccm/...), the coordinator with
# its gate and fence (coordinator/...), the real binaries with the charts' RBAC
# and flags (test/e2e), hybridctl's doctor and cleanup (cmd/hybridctl/...).
pkgs="./ccm/... ./coordinator/... ./test/e2e/... ./cmd/hybridctl/internal/doctor/... ./cmd/hybridctl/internal/cleanup/..."
echo "== go test against kube-apiserver ${OLDEST_KUBE_VERSION}: ${pkgs}" >&2
# shellcheck disable=SC2086
KUBEBUILDER_ASSETS="${assets}" go test -count=1 -timeout 45m ${GO_TEST_FLAGS:-} ${pkgs}
