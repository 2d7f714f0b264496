#!/usr/bin/env bash
# Builds the node and controller binaries of the test cluster (test/cluster):
# kubelet, kube-controller-manager, kube-scheduler and kube-proxy, at the control
# plane's version, from source through the Go module proxy, into a per-version cache
# directory beside the control plane's, and prints that directory. Reuses the cache
# when all four exist.
#
#   KUBE_VERSION      version (default: hack/lib/versions.sh)
#   HYBRID_CCM_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm)
#
# The container runtime is not built: containerd, runc, the CNI plugins, iptables
# and conntrack come from Debian packages (hack/cluster-packages.sh).
set -euo pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/versions.sh"
CACHE_ROOT="${HYBRID_CCM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm}"
OUT="${CACHE_ROOT}/k8s-${KUBE_VERSION}-node"
CMDS=(kubelet kube-controller-manager kube-scheduler kube-proxy)

have=1
for c in "${CMDS[@]}"; do [[ -x "${OUT}/${c}" ]] || have=0; done
if [[ ${have} == 1 ]]; then
  echo "${OUT}"
  exit 0
fi

log() { echo "cluster-binaries: $*" >&2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/hybrid-ccm-node.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/kube-module.sh"
cd "${work}"

log "building ${CMDS[*]} v${KUBE_VERSION} into ${OUT} (a few minutes cold)"
pkgs=()
for c in "${CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${c}"); done
kube_module "${pkgs[@]}"

# One go build for the four: their links run side by side.
mkdir -p "${OUT}.tmp"
CGO_ENABLED=0 go build -trimpath -ldflags "${KUBE_LDFLAGS}" -o "${OUT}.tmp/" "${pkgs[@]}" >&2
for c in "${CMDS[@]}"; do [[ -x "${OUT}.tmp/${c}" ]] || { log "go build wrote no ${c}"; exit 1; }; done
rm -rf "${OUT}"
mv "${OUT}.tmp" "${OUT}"
log "done in ${SECONDS} s"
echo "${OUT}"
