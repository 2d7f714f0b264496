# Sourced by hack/control-plane.sh and hack/cluster-binaries.sh: writes, in the
# current directory, a throwaway module that builds commands of k8s.io/kubernetes
# at KUBE_VERSION through the Go module proxy (k8s.io/kubernetes carries replace
# directives, so `go install ...@version` cannot), and sets KUBE_LDFLAGS to the
# version stamp (/version must not say v0.0.0-master: Helm's kubeVersion checks
# read it).
#
#   kube_module <import path of a main package>...   (extra requires via KUBE_EXTRA_REQUIRE)

kube_module() {
  local minor staging kmod p
  minor="${KUBE_VERSION#*.}"; minor="${minor%%.*}"
  staging="v0.${minor}.${KUBE_VERSION##*.}"
  export GOFLAGS=-mod=mod
  go mod download "k8s.io/kubernetes@v${KUBE_VERSION}" >&2
  kmod="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v${KUBE_VERSION}.mod"
  {
    echo "module hybridccm.local/kube"
    echo
    grep -E '^(go|godebug) ' "${kmod}" || true
    echo
    echo "require ("
    echo "  k8s.io/kubernetes v${KUBE_VERSION}"
    [[ -n "${KUBE_EXTRA_REQUIRE:-}" ]] && echo "  ${KUBE_EXTRA_REQUIRE}"
    echo ")"
    echo
    echo "replace ("
    # every staging module of k8s.io/kubernetes' replace block -> its published version
    awk '/^replace \(/{r=1;next} r&&/^\)/{r=0} r&&/=>/{print $1}' "${kmod}" | sort -u | while read -r m; do
      echo "  ${m} => ${m} ${staging}"
    done
    echo ")"
  } > go.mod
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for p in "$@"; do echo "	_ \"${p}\""; done
    echo ")"
  } > tools.go
  go mod tidy -e >&2

  KUBE_LDFLAGS="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    KUBE_LDFLAGS+=" -X ${p}.gitVersion=v${KUBE_VERSION} -X ${p}.gitMajor=1 -X ${p}.gitMinor=${minor} -X ${p}.gitTreeState=clean"
  done
}
