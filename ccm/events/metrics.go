package events

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

var (
	droppedEvents = metrics.NewCounter(&metrics.CounterOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "events",
		Name:           "dropped_total",
		Help:           "Events not recorded because the event queue was full (a burst of decisions larger than the queue).",
		StabilityLevel: metrics.ALPHA,
	})
	registerOnce sync.Once
)

func register() {
	registerOnce.Do(func() { legacyregistry.MustRegister(droppedEvents) })
}
