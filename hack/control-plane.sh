#!/usr/bin/env bash
# Builds kube-apiserver and etcd from source through the Go module proxy into a
# per-version cache directory outside the repository and prints that directory
# (suitable for KUBEBUILDER_ASSETS). Reuses the cache when both binaries exist.
#
#   KUBE_VERSION  kube-apiserver version (default: hack/lib/versions.sh)
#   ETCD_VERSION  etcd server version     (default: hack/lib/versions.sh)
#   HYBRID_CCM_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm)
#
# Known-good pairs on these machines: 1.37.2+3.7.0 (the etcd 1.37 ships with), 1.36.3+3.6.8, 1.34.4+3.6.4, 1.32.13+3.5.16.
set -euo pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/versions.sh"
CACHE_ROOT="${HYBRID_CCM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm}"
OUT="${CACHE_ROOT}/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}"

if [[ -x "${OUT}/kube-apiserver" && -x "${OUT}/etcd" ]]; then
  echo "${OUT}"
  exit 0
fi

log() { echo "control-plane: $*" >&2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/hybrid-ccm-cp.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/kube-module.sh"
cd "${work}"

log "building kube-apiserver v${KUBE_VERSION} + etcd v${ETCD_VERSION} into ${OUT} (cold build takes several minutes)"
KUBE_EXTRA_REQUIRE="go.etcd.io/etcd/server/v3 v${ETCD_VERSION}" kube_module go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver

mkdir -p "${OUT}.tmp"
CGO_ENABLED=0 go build -trimpath -ldflags "${KUBE_LDFLAGS}" -o "${OUT}.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${OUT}.tmp/etcd" go.etcd.io/etcd/server/v3 >&2
rm -rf "${OUT}"
mv "${OUT}.tmp" "${OUT}"
log "done in ${SECONDS} s"
echo "${OUT}"
