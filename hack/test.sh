#!/usr/bin/env bash
# Runs every test of the module (make test) in two lanes side by side:
#
#   - the cluster lane: the packages that run a real cluster (test/cluster
#     and every package whose tests use it), one package at a time: a cluster
#     is a dozen kubelets, containerds and control-plane daemons, and a
#     machine runs one cluster at a time anyway (test/cluster's lock);
#   - the other lane: the release layout of both architectures, go vet and
#     gofmt (make lint), every other package (in parallel, as go test runs
#     them), test/monitoring, then the fuzz targets (hack/fuzz.sh).
#
# A cluster package waits on pods, leases and outages more than it computes;
# the other lane's work fills that time. Before the lanes part, the commands
# and this machine's release images are built once for both
# (test/testbin/prepare -stage host, HYBRID_CCM_TEST_BIN), and every package
# and test is compiled once (go list -export), so that the two lanes do not
# compile the same packages at the same time; every build with the release's
# compile flags (below).
#
# go test runs with -vet=off, because make lint's go vet ./... runs every
# analyzer go test would, on the same packages and their tests, and with
# -ldflags=-w: test binaries without DWARF link in about two thirds of the
# time, and stack traces do not need it.
#
#   go test flags: GO_TEST_FLAGS (e.g. -run TestX), after those
#   fuzzing: FUZZTIME and FUZZPKG (hack/fuzz.sh; FUZZTIME=0 skips it)
set -euo pipefail
module="$(go list -m)"
# A package runs a cluster when its tests import test/cluster (its lock,
# its Start) or the fleet on it (test/fleet, test/fleet/fleetcheck); one that
# only links them (hybridctl links the demo) runs with the others.
cluster="$(go list -f '{{.ImportPath}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... |
  awk -v m="${module}" '{ for (i = 2; i <= NF; i++) if ($i == m "/test/cluster" || $i == m "/test/fleet" || $i == m "/test/fleet/fleetcheck") { print $1; break } }' |
  sort -u)"
cluster="$(printf '%s\n%s\n' "${cluster}" "${module}/test/cluster" | sed '/^$/d' | sort -u)"
# test/monitoring runs test/e2e's TestMonitoringScenario itself (go test in a
# child process), after the other packages of its lane.
monitoring="$(go list ./test/monitoring/...)"
rest="$(go list ./... | grep -vxF -f <(printf '%s\n%s\n' "${cluster}" "${monitoring}"))"
flags=(-count=1 -vet=off -ldflags=-w)
# Every build of the run with the release's compile flags (-trimpath,
# CGO_ENABLED=0; hack/ship adds only its tags, link flags and platform, which
# do not change how a package compiles): this machine's release images, the
# development builds, the tests and the helpers they build share one compile
# of every package instead of two.
export CGO_ENABLED=0
export GOFLAGS="-trimpath${GOFLAGS:+ ${GOFLAGS}}"
# The Go toolchain with GOGC=BUILD_GOGC (400 from the Makefile: a quarter to
# a half less CPU per compile and link, see there); the test binaries, and
# everything they start, with the caller's GOGC, which hack/lib/test-exec.sh
# (go test -exec) puts back.
export HYBRID_CCM_CALLER_GOGC="${GOGC-}" HYBRID_CCM_CALLER_GOGC_SET="${GOGC+set}"
export GOGC="${BUILD_GOGC:-400}"
flags+=(-exec "$(pwd)/hack/lib/test-exec.sh")

# The commands' binaries and release images, built once for the run rather
# than by every package that runs them (test/testbin): a directory of this
# run's, removed at its end, and checked against the tree before use.
HYBRID_CCM_TEST_BIN="$(mktemp -d "${TMPDIR:-/tmp}/hybrid-ccm-test-bin.XXXXXX")"
export HYBRID_CCM_TEST_BIN
cluster_lane=""
cleanup() {
  # An interrupted run: the cluster lane ends with the same signal; its
  # clusters clean up before the directory goes.
  [[ -n "${cluster_lane}" ]] && wait "${cluster_lane}" 2>/dev/null
  rm -rf "${HYBRID_CCM_TEST_BIN}"
}
trap cleanup EXIT
# Each phase's header says how far into the run it starts (seconds since
# this script began; the prerequisites before it print their own times).
phase() { echo "== [${SECONDS} s] $*" >&2; }
phase "this machine's release images and the development builds (test/testbin/prepare -stage host) into ${HYBRID_CCM_TEST_BIN}"
go run ./test/testbin/prepare -stage host "${HYBRID_CCM_TEST_BIN}"
phase "every package and its tests compiled once for both lanes (go list -export -test -deps ./...)"
go list -export -test -deps ./... >/dev/null

run_cluster_lane() {
  phase "cluster lane: go test -p 1:" ${cluster}
  local rc=0
  # shellcheck disable=SC2086
  go test "${flags[@]}" -p 1 -timeout 45m ${GO_TEST_FLAGS:-} ${cluster} || rc=$?
  phase "cluster lane done (exit ${rc})"
  return "${rc}"
}

run_other_lane() {
  local rc=0
  phase "other lane: both architectures' release images (test/testbin/prepare -stage images)"
  go run ./test/testbin/prepare -stage images "${HYBRID_CCM_TEST_BIN}" || rc=1
  phase "other lane: make lint (go vet, gofmt)"
  make --no-print-directory lint || rc=1
  phase "other lane: go test: $(echo "${rest}" | wc -l) packages without a real cluster"
  # shellcheck disable=SC2086
  go test "${flags[@]}" -timeout 45m ${GO_TEST_FLAGS:-} ${rest} || rc=1
  # test/monitoring: the alerts and the dashboard, evaluated on a run of
  # test/e2e's TestMonitoringScenario.
  phase "other lane: go test: test/monitoring"
  # shellcheck disable=SC2086
  go test "${flags[@]}" -timeout 30m ${GO_TEST_FLAGS:-} ${monitoring} || rc=1
  if [[ "${FUZZTIME:-2000x}" != 0 ]]; then
    phase "other lane: fuzz targets (hack/fuzz.sh ${FUZZTIME:-2000x} ${FUZZPKG:-.})"
    hack/fuzz.sh "${FUZZTIME:-2000x}" "${FUZZPKG:-.}" || rc=1
  fi
  phase "other lane done (exit ${rc})"
  return "${rc}"
}

run_cluster_lane &
cluster_lane=$!
other=0
run_other_lane || other=$?
cluster_rc=0
wait "${cluster_lane}" || cluster_rc=$?
cluster_lane=""
if [[ ${other} != 0 || ${cluster_rc} != 0 ]]; then
  phase "FAIL: cluster lane exit ${cluster_rc}, other lane exit ${other}"
  exit 1
fi
phase "both lanes passed"
