#!/usr/bin/env bash
# Generates the NativeCCM deepcopy code and CRD with a pinned controller-gen,
# and the chart's fence policy from coordinator/gate (hack/fence).
#
#   hack/coordinator-generate.sh           write into the tree
#   hack/coordinator-generate.sh --verify  fail when the tree differs from fresh output
set -euo pipefail

CONTROLLER_GEN="sigs.k8s.io/controller-tools/cmd/controller-gen@v0.19.0"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "${root}"

api=coordinator/api/v1alpha1
crds=charts/ccm-coordinator/crds

gen() { # $1 = object output dir, $2 = crd output dir
  go run "${CONTROLLER_GEN}" \
    object paths="./${api}/..." output:object:dir="$1"
  go run "${CONTROLLER_GEN}" \
    crd:crdVersions=v1 paths="./${api}/..." output:crd:dir="$2"
}

fence=charts/ccm-coordinator/templates/fence.yaml

if [[ "${1:-}" != "--verify" ]]; then
  gen "${api}" "${crds}"
  go run ./hack/fence "${fence}"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
mkdir -p "${tmp}/api" "${tmp}/crds"
gen "${tmp}/api" "${tmp}/crds"
rc=0
diff -u "${api}/zz_generated.deepcopy.go" "${tmp}/api/zz_generated.deepcopy.go" || rc=1
diff -ru "${crds}" "${tmp}/crds" || rc=1
go run ./hack/fence "${tmp}/fence.yaml"
diff -u "${fence}" "${tmp}/fence.yaml" || rc=1
if [[ ${rc} -ne 0 ]]; then
  echo "generated NativeCCM code is stale: run hack/coordinator-generate.sh" >&2
fi
exit ${rc}
