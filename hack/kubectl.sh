#!/usr/bin/env bash
# Builds kubectl at the control plane's version from source through the Go
# module proxy (k8s.io/kubernetes/cmd/kubectl, as hack/cluster-binaries.sh
# builds the node binaries) into a per-version cache directory beside the
# control plane's, and prints that directory. Reuses the cache when kubectl
# exists. test/doccommands runs the docs' kubectl lines with it.
#
#   KUBE_VERSION      version (default: hack/lib/versions.sh)
#   HYBRID_CCM_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm)
set -euo pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/versions.sh"
CACHE_ROOT="${HYBRID_CCM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm}"
OUT="${CACHE_ROOT}/k8s-${KUBE_VERSION}-kubectl"

if [[ -x "${OUT}/kubectl" ]]; then
  echo "${OUT}"
  exit 0
fi

log() { echo "kubectl: $*" >&2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/hybrid-ccm-kubectl.XXXXXX")"
trap 'rm -rf "${work}" "${OUT}.tmp.$$"' EXIT
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/kube-module.sh"
cd "${work}"

log "building kubectl v${KUBE_VERSION} into ${OUT} (a few minutes cold)"
kube_module k8s.io/kubernetes/cmd/kubectl

mkdir -p "${OUT}.tmp.$$"
CGO_ENABLED=0 go build -trimpath -ldflags "${KUBE_LDFLAGS}" -o "${OUT}.tmp.$$/kubectl" k8s.io/kubernetes/cmd/kubectl >&2
mkdir -p "${OUT}"
mv "${OUT}.tmp.$$/kubectl" "${OUT}/kubectl"
log "done in ${SECONDS} s"
echo "${OUT}"
