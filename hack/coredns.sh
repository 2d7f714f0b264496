#!/usr/bin/env bash
# Builds CoreDNS for the test cluster's cluster DNS (test/fleet deploys it as
# Talos does): the command in hack/coredns, a module of its own that links
# github.com/coredns/coredns at COREDNS_VERSION, unmodified, with only the
# plugins of Talos' Corefile (no forward: nothing may reach beyond the
# machine), through the Go module proxy into a cache directory
# coredns-<version>-<digest of hack/coredns> beside the control plane's, and
# prints the binary's path. Reuses the cached binary when present.
#
#   COREDNS_VERSION   version (default: hack/lib/versions.sh); one other than
#                     hack/coredns/go.mod's is resolved afresh (go mod tidy)
#   HYBRID_CCM_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm)
#
# CGO_ENABLED=0: the tests' registry serves it as an image with nothing else
# in it (no libc).
#
# Measured on 2 cores shared with a CI run: the module downloads 27 s; the build
# 5 min 40 s wall (177 s user) with an empty build cache, 3 min 53 s with the
# build cache the other hack/ scripts leave; the binary is 55 MB. Cached: 0.01 s.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/lib/versions.sh"
src="${here}/coredns"
CACHE_ROOT="${HYBRID_CCM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm}"
# The plugin set is the source's: a change to it is another binary.
digest="$(cat "${src}/main.go" "${src}/go.mod" "${src}/go.sum" | sha256sum | cut -c1-12)"
OUT="${CACHE_ROOT}/coredns-${COREDNS_VERSION}-${digest}"
BIN="${OUT}/coredns"

if [[ -x "${BIN}" ]]; then
  echo "${BIN}"
  exit 0
fi

log() { echo "coredns: $*" >&2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/hybrid-ccm-coredns.XXXXXX")"
trap 'rm -rf "${work}" "${OUT}.tmp.$$"' EXIT
cp "${src}/main.go" "${src}/go.mod" "${src}/go.sum" "${work}/"
cd "${work}"

log "building CoreDNS v${COREDNS_VERSION} into ${OUT} (a few minutes cold)"
export GOFLAGS=-mod=readonly
if [[ "$(go list -m -f '{{.Version}}' github.com/coredns/coredns)" != "v${COREDNS_VERSION}" ]]; then
  GOFLAGS=-mod=mod go mod edit -require="github.com/coredns/coredns@v${COREDNS_VERSION}"
  GOFLAGS=-mod=mod go mod tidy >&2
fi

mkdir -p "${OUT}.tmp.$$"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${OUT}.tmp.$$/coredns" . >&2
cp go.mod go.sum "${OUT}.tmp.$$/" # what was built, for the record
rm -rf "${OUT}"
mv "${OUT}.tmp.$$" "${OUT}"
log "done in ${SECONDS} s"
echo "${BIN}"
