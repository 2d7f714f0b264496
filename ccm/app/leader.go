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

// leaseReader publishes leaderTransitions while this process leads.
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
		legacyregistry.MustRegister(leaderTransitions)
		// The leader writes the Lease every retry period; one read as often costs less.
		period := max(le.RetryPeriod.Duration, time.Second)
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			l, err := client.CoordinationV1().Leases(le.ResourceNamespace).Get(ctx, le.ResourceName, metav1.GetOptions{})
			if err != nil {
				klog.V(4).InfoS("Reading the leader-election Lease", "lease", klog.KRef(le.ResourceNamespace, le.ResourceName), "err", err)
				return
			}
			if t := l.Spec.LeaseTransitions; t != nil {
				leaderTransitions.Set(float64(*t))
			}
		}, period)
	})
}
