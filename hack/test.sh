#!/usr/bin/env bash
# Runs every test of the module (make test): first the packages that need no
# real cluster, in parallel as go test runs them; then those that run one
# (test/cluster and every package whose tests use it), one package at a time:
# a cluster is a dozen kubelets, containerds and control-plane daemons, and a
# machine runs one cluster at a time anyway (test/cluster's lock). Before
# either, the commands and their images are built once for all of them
# (test/testbin/prepare, HYBRID_CCM_TEST_BIN).
#
#   go test flags: GO_TEST_FLAGS (e.g. -run TestX)
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
# child process): it runs last, alone, as it did when it was a module of its own.
monitoring="$(go list ./test/monitoring/...)"
rest="$(go list ./... | grep -vxF -f <(printf '%s\n%s\n' "${cluster}" "${monitoring}"))"
# The commands' binaries and release images, built once for the run rather
# than by every package that runs them (test/testbin): a directory of this
# run's, removed at its end, and checked against the tree before use.
HYBRID_CCM_TEST_BIN="$(mktemp -d "${TMPDIR:-/tmp}/hybrid-ccm-test-bin.XXXXXX")"
export HYBRID_CCM_TEST_BIN
trap 'rm -rf "${HYBRID_CCM_TEST_BIN}"' EXIT
echo "== the run's binaries and images (test/testbin/prepare) into ${HYBRID_CCM_TEST_BIN}" >&2
go run ./test/testbin/prepare "${HYBRID_CCM_TEST_BIN}"
echo "== go test: $(echo "${rest}" | wc -l) packages without a real cluster" >&2
# shellcheck disable=SC2086
go test -count=1 -timeout 45m ${GO_TEST_FLAGS:-} ${rest}
echo "== go test -p 1: the packages that run a real cluster:" ${cluster} >&2
# shellcheck disable=SC2086
go test -count=1 -p 1 -timeout 45m ${GO_TEST_FLAGS:-} ${cluster}
# test/monitoring: the alerts and the dashboard, evaluated on a run of test/e2e's
# TestMonitoringScenario.
echo "== go test: test/monitoring" >&2
# shellcheck disable=SC2086
go test -count=1 -timeout 30m ${GO_TEST_FLAGS:-} ${monitoring}
