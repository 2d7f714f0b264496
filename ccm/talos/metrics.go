package talos

import (
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

var (
	apiRequests = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "talos_api",
		Name:           "requests_total",
		Help:           "Talos API requests by operation and gRPC result code.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"op", "code"})
	apiDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Namespace:      "talos_ccm",
		Subsystem:      "talos_api",
		Name:           "request_duration_seconds",
		Help:           "Talos API request latency by operation.",
		Buckets:        []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		StabilityLevel: metrics.ALPHA,
	}, []string{"op"})
	registerOnce sync.Once
)

func register() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(apiRequests, apiDuration)
	})
}

func observe(op string, start time.Time, code codes.Code) {
	register()
	apiRequests.WithLabelValues(op, code.String()).Inc()
	apiDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}
