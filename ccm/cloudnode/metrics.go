package cloudnode

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

var (
	nodesInitialized = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "talos_ccm",
		Name:           "nodes_initialized_total",
		Help:           "Nodes initialized by talos-ccm, by platform.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"platform"})
	initDelay = metrics.NewHistogram(&metrics.HistogramOpts{
		Namespace:      "talos_ccm",
		Name:           "node_initialization_delay_seconds",
		Help:           "Time from node registration to its initialization by talos-ccm.",
		Buckets:        metrics.ExponentialBuckets(0.05, 2, 14),
		StabilityLevel: metrics.ALPHA,
	})
	registerOnce sync.Once
)

func observeInitialized(n *corev1.Node, platform string) {
	registerOnce.Do(func() { legacyregistry.MustRegister(nodesInitialized, initDelay) })
	nodesInitialized.WithLabelValues(platform).Inc()
	initDelay.Observe(time.Since(n.CreationTimestamp.Time).Seconds())
}
