#!/usr/bin/env bash
# Builds the upstream AWS cloud controller manager (cmd/aws-cloud-controller-manager of
# k8s.io/cloud-provider-aws, unmodified) from source through the Go module proxy into a
# per-version cache directory aws-ccm-<version> beside the control plane's, and prints
# the binary's path. Reuses the cached binary when present.
#
#   AWS_CCM_VERSION   module version (default: the release profiles/aws.yaml names in
#                     ccm.image.tags for the control plane's minor, which the
#                     coordinator runs on that control plane)
#   KUBE_VERSION      the control plane's version (default: what
#                     ${KUBEBUILDER_ASSETS}/kube-apiserver --version says, else the default of
#                     hack/lib/versions.sh)
#   HYBRID_CCM_CACHE  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm)
#
# A throwaway wrapper module requires the exact version and carries the module's own
# replace directives (none as of v1.37), so the build resolves the same dependency
# versions as the upstream image's. CGO_ENABLED=0: the tests' registry serves it as
# an image with nothing else in it (no libc) for containerd to run. v1.36.2 and
# v1.37.1 need Go 1.26 (their go.mod says go 1.26.0).
#
# Measured on 2 shared cores: cold (empty module and build caches) 6 min 34 s wall
# (265 s user), about 500 MB of module downloads and 900 MB of build cache; the binary
# is 110 MB. Warm (binary in the cache, the module's source in the module cache): 0.02 s.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${AWS_CCM_VERSION:-}" ]]; then
  kube="${KUBE_VERSION:-}"
  if [[ -z "${kube}" && -x "${KUBEBUILDER_ASSETS:-}/kube-apiserver" ]]; then
    # "Kubernetes v1.37.2"
    kube="$("${KUBEBUILDER_ASSETS}/kube-apiserver" --version | awk '{print $2}')"
  fi
  [[ -n "${kube}" ]] || kube="$(source "${repo}/hack/lib/versions.sh" && echo "${KUBE_VERSION}")"
  kube="${kube#v}"
  minor="$(echo "${kube}" | cut -d. -f1,2)"
  # as the coordinator chooses: the line '"1.N": <tag>' of ccm.image.tags for the
  # control plane's minor, else for the minor before (one minor of skew)
  older="1.$(( $(echo "${minor}" | cut -d. -f2) - 1 ))"
  for m in "${minor}" "${older}"; do
    AWS_CCM_VERSION="$(awk -v key="\"${m}\":" '$1==key {print $2; exit}' "${repo}/profiles/aws.yaml")"
    [[ -z "${AWS_CCM_VERSION}" ]] || break
  done
  [[ -n "${AWS_CCM_VERSION}" ]] || {
    echo "aws-ccm: profiles/aws.yaml names no release for Kubernetes ${minor} or ${older} (ccm.image.tags); the control plane is ${kube}" >&2
    exit 1
  }
fi
CACHE_ROOT="${HYBRID_CCM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hybrid-ccm}"
OUT="${CACHE_ROOT}/aws-ccm-${AWS_CCM_VERSION}"
BIN="${OUT}/aws-cloud-controller-manager"

# The module's source stays in the Go module cache beside the binary: test/takeover
# installs the AWS CCM's own Helm chart from it (charts/aws-cloud-controller-manager).
MODULE_DIR="$(go env GOMODCACHE)/k8s.io/cloud-provider-aws@${AWS_CCM_VERSION}"
if [[ -x "${BIN}" && -d "${MODULE_DIR}" ]]; then
  echo "${BIN}"
  exit 0
fi

log() { echo "aws-ccm: $*" >&2; }

# Checksums of k8s.io/cloud-provider-aws pinned here, for versions the checksum database
# does not answer for (v1.34.0, which the profile named before it named a release per
# minor: its lookup is 404; the proxy serves the tag's commit
# ed5a860b45fcf4fa6d38e4086b5acb6e709d173e). The releases the profile names now
# (v1.34.4, v1.35.3, v1.36.2, v1.37.1) are answered by the database. Every dependency is
# still verified by the checksum database as usual.
pinned_sums() {
  case "$1" in
    v1.34.0)
      echo "k8s.io/cloud-provider-aws v1.34.0 h1:uX4fbMle7UNJ9a4JR6eAps6XqU7r8d+ayhDE3lyLkKc="
      echo "k8s.io/cloud-provider-aws v1.34.0/go.mod h1:a8p1e6RHviJmZ/ZJK9S26CpZ07uv/jCZa93opvKSDA8="
      ;;
  esac
}

# Modules the Go module proxy here serves only under their old path: a replace that
# points at the new path becomes a require of the old one at the same version.
# github.com/cel-expr/cel-go is github.com/google/cel-go renamed (its go.mod still says
# module github.com/google/cel-go, the tags are the same): v1.34.4, v1.35.3, v1.36.2 and
# v1.37.1 replace google/cel-go with cel-expr/cel-go v0.31.0, which the proxy refuses
# (403); the tree of google/cel-go v0.31.0 it serves is file for file that of
# cel-expr/cel-go's tag v0.31.0 (compared 2026-11-26).
renamed() {
  sed -E 's#^replace[[:space:]]+github\.com/google/cel-go[[:space:]]+=>[[:space:]]+github\.com/cel-expr/cel-go[[:space:]]+(v[^[:space:]]+)[[:space:]]*$#require github.com/google/cel-go \1#'
}

work="$(mktemp -d "${TMPDIR:-/tmp}/hybrid-ccm-aws.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
cd "${work}"

log "building k8s.io/cloud-provider-aws ${AWS_CCM_VERSION} into ${OUT} (a cold build takes a few minutes)"
export GOFLAGS=-mod=mod
pinned_sums "${AWS_CCM_VERSION}" > go.sum
if [[ -s go.sum ]]; then
  # go.sum pins the module; the database is not asked about it.
  export GONOSUMDB="k8s.io/cloud-provider-aws${GONOSUMDB:+,${GONOSUMDB}}"
fi
mod_module() {
  printf 'module hybridccm.local/awsccm\n\ngo 1.24\n\nrequire k8s.io/cloud-provider-aws %s\n' "${AWS_CCM_VERSION}" > go.mod
}
mod_module
go mod download -json "k8s.io/cloud-provider-aws@${AWS_CCM_VERSION}" > download.json || { cat download.json >&2; exit 1; }
if [[ -x "${BIN}" ]]; then
  # built before; only the module's source was missing
  echo "${BIN}"
  exit 0
fi
amod="$(go env GOMODCACHE)/cache/download/k8s.io/cloud-provider-aws/@v/${AWS_CCM_VERSION}.mod"

{
  echo "module hybridccm.local/awsccm"
  echo
  grep -E '^(go|godebug) ' "${amod}" || true
  echo
  echo "require k8s.io/cloud-provider-aws ${AWS_CCM_VERSION}"
  echo
  # the module's own replace directives, block and single-line forms
  awk '
    /^replace \(/ {r=1; next}
    r && /^\)/ {r=0; next}
    r && /=>/ {print "replace " $0; next}
    /^replace .*=>/ {print}
  ' "${amod}" | renamed
} > go.mod

cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/cloud-provider-aws/cmd/aws-cloud-controller-manager"
)
GO

go mod tidy -e >&2

minor="${AWS_CCM_VERSION#v*.}"; minor="${minor%%.*}"
ld="-s -w -X main.gitVersion=${AWS_CCM_VERSION}"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X ${p}.gitVersion=${AWS_CCM_VERSION} -X ${p}.gitMajor=1 -X ${p}.gitMinor=${minor} -X ${p}.gitTreeState=clean"
done

mkdir -p "${OUT}.tmp"
CGO_ENABLED=0 go build -trimpath -ldflags "${ld}" -o "${OUT}.tmp/aws-cloud-controller-manager" \
  k8s.io/cloud-provider-aws/cmd/aws-cloud-controller-manager >&2
cp go.mod go.sum "${OUT}.tmp/" # what was built, for the record
rm -rf "${OUT}"
mv "${OUT}.tmp" "${OUT}"
log "done in ${SECONDS} s"
echo "${BIN}"
