package csr

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

var (
	decisions = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "csr",
		Name:           "decisions_total",
		Help:           "Decisions of node-csr-approval on kubelet serving CSRs, by decision (approve, deny, retry) and reason.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"decision", "reason"})
	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(decisions)
	})
}

func countDecision(d Decision) {
	decisions.WithLabelValues(d.Action.String(), d.Reason).Inc()
}
