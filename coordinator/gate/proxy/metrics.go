package proxy

import "github.com/prometheus/client_golang/prometheus"

// Decisions the view takes on a request (label "decision").
const (
	decisionForwarded = "forwarded" // passed through unchanged (or a node in the view)
	decisionFiltered  = "filtered"  // list/watch with the platform selector added
	decisionHidden    = "hidden"    // 404 for a node outside the view
	decisionRefused   = "refused"   // never forwarded (deletecollection, create, odd paths)
	decisionError     = "error"     // the check or the API server failed
)

// routeUnauthenticated is the route label of requests refused for want of the
// client token (before their path is read).
const routeUnauthenticated = "unauthenticated"

// Sources of a single-node check (label "source").
const (
	sourceCache = "cache"
	sourceAPI   = "api"
)

type metrics struct {
	requests *prometheus.CounterVec
	checks   *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "ccm_gate",
			Name:      "requests_total",
			Help:      "Requests through the gate by route and decision.",
		}, []string{"route", "decision"}),
		checks: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "ccm_gate",
			Name:      "node_check_duration_seconds",
			Help:      "Time to decide whether a single node is in the view, by source (cache or API server read).",
			Buckets:   []float64{0.00001, 0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1},
		}, []string{"source"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.checks)
	}
	return m
}
