package reach

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

var (
	unreachableNodes = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "talos_api",
		Name:           "unreachable_nodes",
		Help:           "Nodes whose Talos API did not answer at their last lookup, by where the request stopped (hop: endpoint, node) and why (cause: refused, timeout, no-route, tls, permission-denied, no-endpoint, other).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"hop", "cause"})
	lookupsFailed = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "talos_api",
		Name:           "unreachable_lookups_total",
		Help:           "Addresses of nodes whose Talos API did not answer a lookup, by where the request stopped (hop) and why (cause).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"hop", "cause"})
	registerOnce sync.Once
)

func register() {
	registerOnce.Do(func() { legacyregistry.MustRegister(unreachableNodes, lookupsFailed) })
}
