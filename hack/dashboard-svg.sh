#!/usr/bin/env bash
# Draws docs/images/dashboard.svg: the Grafana dashboard the charts ship,
# evaluated with Prometheus' engine over a fresh run of test/e2e's
# TestMonitoringScenario (real talos-ccm, ccm-coordinator and kube-apiserver).
# Not Grafana: test/monitoring/cmd/dashboard-svg draws the panels itself.
# Needs KUBEBUILDER_ASSETS (as make test sets it); SCRAPES=<dir> reuses the
# scrapes of an earlier run (HYBRID_CCM_SCRAPES=<dir> go test -run TestMonitoringScenario ./test/e2e/).
set -euo pipefail
cd "$(dirname "$0")/../test/monitoring"
exec go run ./cmd/dashboard-svg -out ../../docs/images/dashboard.svg ${SCRAPES:+-scrapes "${SCRAPES}"}
