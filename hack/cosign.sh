#!/usr/bin/env bash
# Builds the cosign CLI (cmd/cosign of github.com/sigstore/cosign/v2, unmodified) from
# source through the Go module proxy into a per-version cache directory
# cosign-<version> beside the control plane's, and prints the binary's path. Reuses the
# cached binary when present. hack/ship's signature test verifies what `make release`
# signed with it (test/signing).
#
#   --cached          only print the cached binary's path; exit 3 (saying so) when it is
#                     not built yet: the tests that run cosign skip then (make test does
#                     not build it: a cold build is too long for CI's budget)
#
#   COSIGN_VERSION    module version (default below)
#   HYBRID_CCM_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm)
#
# A throwaway wrapper module requires the exact version; cosign's go.mod has no replace
# directives (v2.6.5), so the build resolves the dependency versions cosign's own go.mod
# names (minimal version selection from cosign alone).
#
# Measured cold (empty module and build caches) on 2 cores shared with other builds
# (load average 14-24, so the wall time is far above an idle machine's): 24 min 46 s
# wall, 328 s user + 78 s system CPU (about 1.5x hack/aws-ccm.sh's CPU), 1.8-2.8 GB of
# module downloads, 330 MB+ of build cache; the binary is 98 MB. Warm (binary in the
# cache): 0.01 s.
set -euo pipefail

COSIGN_VERSION="${COSIGN_VERSION:-v2.6.5}"
CACHE_ROOT="${HYBRID_CCM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm}"
OUT="${CACHE_ROOT}/cosign-${COSIGN_VERSION}"
BIN="${OUT}/cosign"

if [[ -x "${BIN}" ]]; then
  echo "${BIN}"
  exit 0
fi
if [[ "${1:-}" == "--cached" ]]; then
  echo "cosign ${COSIGN_VERSION} is not built (${BIN}): make cosign builds it" >&2
  exit 3
fi

log() { echo "cosign: $*" >&2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/hybrid-ccm-cosign.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
cd "${work}"

log "building github.com/sigstore/cosign/v2 ${COSIGN_VERSION} into ${OUT} (a cold build takes a few minutes)"
export GOFLAGS=-mod=mod
printf 'module hybridccm.local/cosign\n\ngo 1.25.0\n' > go.mod
# go get, not go mod tidy: only the modules cmd/cosign builds from are downloaded
# (tidy fetches every dependency's tests too, about 2.8 GB).
go get "github.com/sigstore/cosign/v2/cmd/cosign@${COSIGN_VERSION}" >&2

ld="-s -w -X sigs.k8s.io/release-utils/version.gitVersion=${COSIGN_VERSION} -X sigs.k8s.io/release-utils/version.gitTreeState=clean"
mkdir -p "${OUT}.tmp"
CGO_ENABLED=0 go build -trimpath -ldflags "${ld}" -o "${OUT}.tmp/cosign" github.com/sigstore/cosign/v2/cmd/cosign >&2
cp go.mod go.sum "${OUT}.tmp/" # what was built, for the record
rm -rf "${OUT}"
mv "${OUT}.tmp" "${OUT}"
log "done"
echo "${BIN}"
