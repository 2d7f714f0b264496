package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// The control plane of the suite has no kubelet and no controller-manager: a
// release's Deployment never gets pods, and nothing takes its lease. This file
// writes what they would: Pod objects with statuses (as a kubelet reports
// them) and Leases (as client-go's leader election writes them).

// simulatedLeaseDuration is the leaseDurationSeconds of simulated leaders.
const simulatedLeaseDuration = 15

// runCCMs plays kubelet and leader election for every native CCM Deployment in
// the release namespace whose release skip does not claim: one running pod,
// leading, renewing its lease. The health tests drive their releases' pods and
// leases themselves.
func runCCMs(ctx context.Context, c client.Client, skip func(release string) bool) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var deps appsv1.DeploymentList
		if err := c.List(ctx, &deps, client.InNamespace(releaseNamespace), client.HasLabels{release.NativeCCMLabel}); err != nil {
			continue
		}
		live := map[string]bool{}
		for i := range deps.Items {
			d := &deps.Items[i]
			rel := d.Labels[release.NativeCCMLabel]
			if skip(rel) {
				continue
			}
			name := d.Name + "-sim"
			live[name] = true
			if err := ensurePod(ctx, c, d, name, runningStatus(d), false); err != nil {
				continue
			}
			if leaseName, leaseNS, ok := leaseOf(d); ok {
				_ = renewLease(ctx, c, leaseNS, leaseName, name+"_simulated", simulatedLeaseDuration, 3*time.Second)
			}
		}
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(releaseNamespace), client.HasLabels{release.NativeCCMLabel}); err != nil {
			continue
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if strings.HasSuffix(p.Name, "-sim") && !live[p.Name] {
				_ = c.Delete(ctx, p)
			}
		}
	}
}

// leaseOf reads the lease a Deployment's CCM container elects its leader with.
func leaseOf(d *appsv1.Deployment) (name, namespace string, ok bool) {
	for _, ctr := range d.Spec.Template.Spec.Containers {
		if w, ok := ParseCCMContainer("Deployment/"+d.Namespace+"/"+d.Name, ctr); ok {
			return w.LeaseName, w.LeaseNamespace, true
		}
	}
	return "", "", false
}

// runningStatus is the status a kubelet reports for a pod of d whose
// containers all run.
func runningStatus(d *appsv1.Deployment) corev1.PodStatus {
	s := corev1.PodStatus{Phase: corev1.PodRunning}
	for _, ctr := range d.Spec.Template.Spec.Containers {
		s.ContainerStatuses = append(s.ContainerStatuses, corev1.ContainerStatus{
			Name: ctr.Name, Image: ctr.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
		})
	}
	return s
}

// ensurePod creates pod name of Deployment d (as its ReplicaSet would) if it
// does not exist, and writes status as its kubelet would (unless the pod
// already reports that phase and as many containers, and always is false).
func ensurePod(ctx context.Context, c client.Client, d *appsv1.Deployment, name string, status corev1.PodStatus, always bool) error {
	p := &corev1.Pod{}
	err := c.Get(ctx, client.ObjectKey{Namespace: d.Namespace, Name: name}, p)
	if apierrors.IsNotFound(err) {
		labels := map[string]string{"pod-template-hash": "6d4b7c9f8"}
		for k, v := range d.Spec.Template.Labels {
			labels[k] = v
		}
		p = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: d.Namespace, Labels: labels,
				GenerateName: d.Name + "-6d4b7c9f8-",
			},
			Spec: *d.Spec.Template.Spec.DeepCopy(),
		}
		if err := c.Create(ctx, p); err != nil {
			return err
		}
		err = nil
	}
	if err != nil {
		return err
	}
	if !always && p.Status.Phase == status.Phase && len(p.Status.ContainerStatuses) == len(status.ContainerStatuses) {
		return nil // already reported
	}
	p.Status = status
	return c.Status().Update(ctx, p)
}

// renewLease writes the lease as client-go's leader election does when holder
// leads: holderIdentity, leaseDurationSeconds and renewTime, renewed when it
// is older than every.
func renewLease(ctx context.Context, c client.Client, namespace, name, holder string, durationSeconds int32, every time.Duration) error {
	now := metav1.NowMicro()
	l := &coordinationv1.Lease{}
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, l)
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(durationSeconds),
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: ptr.To(int32(0)),
			},
		}
		return c.Create(ctx, l)
	}
	if err != nil {
		return err
	}
	s := &l.Spec
	if s.HolderIdentity != nil && *s.HolderIdentity == holder && s.RenewTime != nil && time.Since(s.RenewTime.Time) < every {
		return nil
	}
	if s.HolderIdentity == nil || *s.HolderIdentity != holder {
		s.AcquireTime = &now
		s.LeaseTransitions = ptr.To(ptr.Deref(s.LeaseTransitions, 0) + 1)
	}
	s.HolderIdentity, s.LeaseDurationSeconds, s.RenewTime = ptr.To(holder), ptr.To(durationSeconds), &now
	return c.Update(ctx, l)
}

// leader renews a lease as holder until stopped, like a leading CCM.
type leader struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func lead(namespace, name, holder string, durationSeconds int32) *leader {
	ctx, cancel := context.WithCancel(context.Background())
	l := &leader{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			if err := renewLease(ctx, k8s, namespace, name, holder, durationSeconds, time.Duration(durationSeconds)*time.Second/6); err != nil && ctx.Err() == nil {
				fmt.Println("renew lease:", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return l
}

// stop stops renewing (the leader hangs or is gone).
func (l *leader) stop() {
	l.cancel()
	<-l.done
}
