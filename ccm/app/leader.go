package app

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	cloudcontrollerconfig "k8s.io/cloud-provider/app/config"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
)

// leaderTransitions is the leader-election Lease's spec.leaseTransitions as
// the leader last read it: it counts every change of holder since the Lease
// was created, whichever process made it, so a fast rise is a leader change
// storm (the TalosCCMLeaderChangeStorm alert) even though each talos-ccm
// process leads at most once.
var leaderTransitions = metrics.NewGauge(&metrics.GaugeOpts{
	Namespace:      "talos_ccm",
	Name:           "leader_transitions",
	Help:           "Changes of holder of talos-ccm's leader-election Lease (its spec.leaseTransitions), read by the leader every retry period.",
	StabilityLevel: metrics.ALPHA,
})

// leaseReader publishes leaderTransitions while this process leads, from
// its first read of the Lease on.
type leaseReader struct{ once sync.Once }

// start begins reading the Lease (once per process; the controllers call it
// when they start, that is once this process leads). Without leader election
// there is no Lease and nothing is exported.
func (r *leaseReader) start(ctx context.Context, cc *cloudcontrollerconfig.CompletedConfig) {
	le := cc.ComponentConfig.Generic.LeaderElection
	if !le.LeaderElect {
		return
	}
	r.once.Do(func() {
		client, err := kubernetes.NewForConfig(cc.Kubeconfig)
		if err != nil {
			klog.ErrorS(err, "Cannot read the leader-election Lease; talos_ccm_leader_transitions is not exported")
			return
		}
		// The leader writes the Lease every retry period; one read as often costs less.
		period := max(le.RetryPeriod.Duration, time.Second)
		var registered bool
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			l, err := client.CoordinationV1().Leases(le.ResourceNamespace).Get(ctx, le.ResourceName, metav1.GetOptions{})
			if err != nil {
				klog.V(4).InfoS("Reading the leader-election Lease", "lease", klog.KRef(le.ResourceNamespace, le.ResourceName), "err", err)
				return
			}
			var n float64 // a Lease without the count has had no change of holder
			if t := l.Spec.LeaseTransitions; t != nil {
				n = float64(*t)
			}
			// Exported from the first read on: a registered gauge reads 0
			// until set, and a new leader of a Lease that changed holder
			// before, showing 0 for a moment, would be a fall and a rise
			// of the count that never happened (the storm alert takes the
			// spread of an hour's values).
			if !registered {
				legacyregistry.MustRegister(leaderTransitions)
				registered = true
			}
			leaderTransitions.Set(n)
		}, period)
	})
}
