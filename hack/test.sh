#!/usr/bin/env bash
# Runs every test of the module (make test): first the packages that need no
# real cluster, in parallel as go test runs them; then those that run one
# (test/cluster and every package whose tests link it), one package at a time:
# a cluster is a dozen kubelets, containerds and control-plane daemons, and a
# machine runs one cluster at a time anyway (test/cluster's lock).
#
#   go test flags: GO_TEST_FLAGS (e.g. -run TestX)
set -euo pipefail
module="$(go list -m)"
cluster="$(go list -test -f '{{.ImportPath}} {{join .Deps " "}}' ./... |
  awk -v dep="${module}/test/cluster" '{ for (i = 2; i <= NF; i++) if ($i == dep) { print $1; break } }' |
  sed -e 's/\.test$//' -e 's/_test$//' | sort -u)"
cluster="$(printf '%s\n%s\n' "${cluster}" "${module}/test/cluster" | sed '/^$/d' | sort -u)"
# test/monitoring runs test/e2e's TestMonitoringScenario itself (go test in a
# child process): it runs last, alone, as it did when it was a module of its own.
monitoring="$(go list ./test/monitoring/...)"
rest="$(go list ./... | grep -vxF -f <(printf '%s\n%s\n' "${cluster}" "${monitoring}"))"
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
