package cloudnode

import (
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
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

// providerIDMismatch counts the nodes kept uninitialized because the
// providerID they were registered with disagrees with their Talos API.
var providerIDMismatch = metrics.NewGauge(&metrics.GaugeOpts{
	Namespace:      "talos_ccm",
	Name:           "nodes_providerid_mismatch",
	Help:           "Nodes kept uninitialized because the providerID they were registered with disagrees with their Talos API (an admin must resolve it).",
	StabilityLevel: metrics.ALPHA,
})

var registerMismatchOnce sync.Once

// mismatched is the set of nodes kept uninitialized for a providerID mismatch,
// exported as talos_ccm_nodes_providerid_mismatch.
type mismatched struct {
	mu    sync.Mutex
	nodes map[string]bool
}

func (m *mismatched) set(node string, held bool) {
	registerMismatchOnce.Do(func() { legacyregistry.MustRegister(providerIDMismatch) })
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.nodes == nil {
		m.nodes = map[string]bool{}
	}
	if m.nodes[node] == held {
		return
	}
	if held {
		m.nodes[node] = true
		providerIDMismatch.Inc()
	} else {
		delete(m.nodes, node)
		providerIDMismatch.Dec()
	}
}

// uninitializedDesc: one series per node that still carries the
// uninitialized taint, so that an alert's for: says how long is too long
// (the TalosCCMNodeUninitialized alert) and count() how many wait.
var uninitializedDesc = metrics.NewDesc("talos_ccm_node_uninitialized",
	"Nodes not initialized yet (tainted node.cloudprovider.kubernetes.io/uninitialized): 1 per node, from talos-ccm's node cache at scrape time.",
	[]string{"node"}, nil, metrics.ALPHA, "")

// uninitializedCollector reads the controller's node cache at scrape time.
type uninitializedCollector struct {
	metrics.BaseStableCollector
	lister atomic.Pointer[corelisters.NodeLister]
}

var (
	uninitialized             = &uninitializedCollector{}
	registerUninitializedOnce sync.Once
)

// watchUninitialized exports the nodes of l that are not initialized yet.
func watchUninitialized(l corelisters.NodeLister) {
	uninitialized.lister.Store(&l)
	registerUninitializedOnce.Do(func() { legacyregistry.CustomMustRegister(uninitialized) })
}

func (c *uninitializedCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- uninitializedDesc
}

func (c *uninitializedCollector) CollectWithStability(ch chan<- metrics.Metric) {
	l := c.lister.Load()
	if l == nil {
		return
	}
	nodes, err := (*l).List(labels.Everything())
	if err != nil {
		return
	}
	for _, n := range nodes {
		if isUninitialized(n) {
			ch <- metrics.NewLazyConstMetric(uninitializedDesc, metrics.GaugeValue, 1, n.Name)
		}
	}
}
