package ipam

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

var (
	cidrsAllocated = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "ipam",
		Name:           "cidrs_allocated",
		Help:           "Pod CIDRs held by nodes, per pool (a cluster CIDR, or node-ipv6-prefixes for the cloud allocator).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"pool"})
	cidrsFree = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "ipam",
		Name:           "cidrs_free",
		Help:           "Pod CIDRs still free, per pool (for node-ipv6-prefixes: summed over the node prefixes seen since start-up).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"pool"})
	exhausted = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "ipam",
		Name:           "exhausted_total",
		Help:           "Allocations that found the pool without a free CIDR (the node waits).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"pool"})
	assignments = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "ipam",
		Name:           "assignments_total",
		Help:           "Writes of spec.podCIDRs by result: assigned, adopted (the node already had CIDRs written by someone else), failed.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
	overlapsFound = metrics.NewCounter(&metrics.CounterOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "ipam",
		Name:           "overlaps_total",
		Help:           "Node CIDRs found overlapping another node's CIDR or the service range (written by someone else; reported, not changed).",
		StabilityLevel: metrics.ALPHA,
	})
	rebuildSeconds = metrics.NewGauge(&metrics.GaugeOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "ipam",
		Name:           "rebuild_duration_seconds",
		Help:           "Time the last start-up rebuild of the CIDR ledger from the nodes' spec.podCIDRs took (after the node cache synced).",
		StabilityLevel: metrics.ALPHA,
	})
	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(cidrsAllocated, cidrsFree, exhausted, assignments, overlapsFound, rebuildSeconds)
	})
}

func publishPool(name string, allocated, free uint64) {
	cidrsAllocated.WithLabelValues(name).Set(float64(allocated))
	cidrsFree.WithLabelValues(name).Set(float64(free))
}
