package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	flag "github.com/spf13/pflag"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// HealthOptions say how the coordinator judges whether an installed native CCM
// is working.
type HealthOptions struct {
	// LeaseDuration is assumed while the CCM's Lease does not exist yet (a
	// Lease carries its own duration). 15s is the default of every CCM built
	// on k8s.io/cloud-provider.
	LeaseDuration time.Duration
	// CrashLoopRestarts is the restart count from which a container whose
	// pod leads nothing is crash-looping (CrashLoopBackOff counts at once).
	CrashLoopRestarts int32
}

// BindFlags registers the options on fs.
func (o *HealthOptions) BindFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.LeaseDuration, "ccm-lease-duration", 15*time.Second,
		"Leader-election lease duration assumed for a native CCM whose Lease does not exist yet; the NativeCCM is checked again at half of it while its CCM is not healthy.")
	fs.Int32Var(&o.CrashLoopRestarts, "ccm-crash-loop-restarts", 3,
		"Restarts from which a native CCM container is reported as crash-looping when no pod of its release holds the lease.")
}

func (o HealthOptions) withDefaults() HealthOptions {
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = 15 * time.Second
	}
	if o.CrashLoopRestarts <= 0 {
		o.CrashLoopRestarts = 3
	}
	return o
}

// health is what checkHealth concluded.
type health struct {
	reason, message string
	// leader is the Lease as observed (nil: no Lease).
	leader *v1.LeaderStatus
	// leaseDuration is the Lease's duration, or the assumed one.
	leaseDuration time.Duration
	// expires is when the Lease runs out unless renewed (zero: no holder).
	expires time.Time
}

func (h health) healthy() bool { return h.reason == v1.LeaseRenewedReason }

// transient reports whether the CCM is starting or changing leaders, rather than failing.
func (h health) transient() bool {
	switch h.reason {
	case v1.NoRunningPodsReason, v1.LeaseNotFoundReason, v1.LeaderGoneReason:
		return true
	}
	return false
}

// checkHealth sets the Healthy condition and status.leader of an installed
// release, and makes Ready say so when the CCM is not working. It returns how
// soon to look again, and a wait while the CCM is starting.
func (r *NativeCCMReconciler) checkHealth(ctx context.Context, obj *v1.NativeCCM, l release.Lifecycle) (time.Duration, error) {
	now := r.now()
	h, err := r.observeHealth(ctx, l, now)
	if err != nil {
		return 0, err
	}
	obj.Status.Leader = h.leader

	prev := conditions.Get(obj, v1.HealthyCondition)
	changed := prev == nil || prev.Reason != h.reason || prev.Message != h.message
	if h.healthy() {
		if prev != nil && prev.Status == metav1.ConditionFalse {
			r.event(obj, corev1.EventTypeNormal, h.reason, "native CCM running again: "+h.message)
		}
		conditions.MarkTrue(obj, v1.HealthyCondition, h.reason, "%s", h.message)
		// Look again when the lease would have run out unless renewed.
		return max(h.expires.Sub(now), 0) + h.leaseDuration/2, nil
	}
	conditions.MarkFalse(obj, v1.HealthyCondition, h.reason, "%s", h.message)
	conditions.MarkFalse(obj, meta.ReadyCondition, h.reason, "%s", h.message)
	again := max(h.leaseDuration/2, time.Second)
	if h.transient() {
		return 0, &waitError{reason: h.reason, after: again, err: fmt.Errorf("%s", h.message)}
	}
	if changed {
		r.event(obj, corev1.EventTypeWarning, h.reason, h.message)
	}
	return again, nil
}

// observeHealth reads the release's pods (cached, label-selected) and its
// Lease (directly: see docs/coordinator.md, "What Ready means").
func (r *NativeCCMReconciler) observeHealth(ctx context.Context, l release.Lifecycle, now time.Time) (health, error) {
	opts := r.Health.withDefaults()
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(l.Namespace), client.MatchingLabels{release.NativeCCMLabel: l.Release}); err != nil {
		return health{}, fmt.Errorf("list pods of release %s: %w", l.Release, err)
	}
	leaseRef := l.Namespace + "/" + l.LeaseName
	var lease coordinationv1.Lease
	err := r.getLease(ctx, client.ObjectKey{Namespace: l.Namespace, Name: l.LeaseName}, &lease)
	if err != nil && !apierrors.IsNotFound(err) {
		return health{}, fmt.Errorf("get lease %s: %w", leaseRef, err)
	}
	found := err == nil

	h := health{leaseDuration: opts.LeaseDuration}
	var holder, holderPod string
	if found {
		s := lease.Spec
		h.leader = &v1.LeaderStatus{Lease: leaseRef}
		if s.HolderIdentity != nil {
			holder = *s.HolderIdentity
		}
		h.leader.Holder = holder
		if s.LeaseDurationSeconds != nil && *s.LeaseDurationSeconds > 0 {
			h.leader.LeaseDurationSeconds = *s.LeaseDurationSeconds
			h.leaseDuration = time.Duration(*s.LeaseDurationSeconds) * time.Second
		}
		last := s.RenewTime
		if last == nil {
			last = s.AcquireTime
		}
		if last != nil {
			h.leader.RenewTime = last.DeepCopy()
			h.expires = last.Add(h.leaseDuration)
		}
		// client-go's leader election writes <hostname>_<uuid>.
		holderPod, _, _ = strings.Cut(holder, "_")
	}
	fresh := holder != "" && now.Before(h.expires)

	var running int
	var leaderPod *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodRunning {
			running++
		}
		if holderPod != "" && p.Name == holderPod {
			leaderPod = p
		}
	}
	crash := crashLooping(pods.Items, opts.CrashLoopRestarts)
	renewed := ""
	if h.leader != nil && h.leader.RenewTime != nil {
		renewed = h.leader.RenewTime.UTC().Format(time.RFC3339)
	}

	switch {
	case leaderPod != nil && fresh:
		h.leader.Pod = leaderPod.Name
		h.reason = v1.LeaseRenewedReason
		// No renew time here (status.leader has it): a message that changes
		// with every renewal would be one more status write per check.
		h.message = fmt.Sprintf("pod %s leads (lease %s)", leaderPod.Name, leaseRef)
	case fresh && !ownPodName(holderPod, l.Release, pods.Items):
		h.reason = v1.LeaseHeldByForeignIdentityReason
		h.message = fmt.Sprintf("lease %s is held by %q, which is not a pod of release %s (renewed at %s)", leaseRef, holder, l.Release, renewed)
	case crash != "":
		h.reason = v1.CrashLoopingReason
		h.message = crash
	case fresh:
		h.reason = v1.LeaderGoneReason
		h.message = fmt.Sprintf("lease %s is held by pod %s, which no longer exists; it expires at %s", leaseRef, holderPod, h.expires.UTC().Format(time.RFC3339))
	case holder != "" && (leaderPod != nil || running > 0):
		h.reason = v1.LeaseNotRenewedReason
		h.message = fmt.Sprintf("lease %s held by %q was last renewed at %s, more than %s ago, and no pod of release %s took it over", leaseRef, holder, renewed, h.leaseDuration, l.Release)
	case running == 0:
		h.reason = v1.NoRunningPodsReason
		h.message = fmt.Sprintf("release %s has no running pod (%d pod(s))", l.Release, len(pods.Items))
		if pull := imagePullFailing(pods.Items); pull != "" {
			h.message += "; " + pull
		}
		if holder != "" {
			h.message += fmt.Sprintf("; lease %s was last renewed by %q at %s", leaseRef, holder, renewed)
		}
	case !found:
		h.reason = v1.LeaseNotFoundReason
		h.message = fmt.Sprintf("%d pod(s) of release %s running, none has created lease %s yet", running, l.Release, leaseRef)
	default:
		h.reason = v1.LeaseNotFoundReason
		h.message = fmt.Sprintf("%d pod(s) of release %s running, none holds lease %s yet", running, l.Release, leaseRef)
	}
	return h, nil
}

// ownPodName reports whether a lease holder's pod name is, or was, a pod of
// the release: a current pod, or a name with the prefix of the release's
// workload (a pod of an earlier ReplicaSet, replaced by a rollout).
func ownPodName(name, releaseName string, pods []corev1.Pod) bool {
	if name == "" {
		return false
	}
	prefixes := []string{releaseName + "-"}
	for _, p := range pods {
		if p.Name == name {
			return true
		}
		if g := p.GenerateName; g != "" {
			// Deployment pods: <deployment>-<pod-template-hash>-; DaemonSet pods: <daemonset>-.
			if h := p.Labels["pod-template-hash"]; h != "" {
				g = strings.TrimSuffix(g, h+"-")
			}
			prefixes = append(prefixes, g)
		}
	}
	return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// crashLooping describes the first container of the pods that restarts
// repeatedly, with its own last words, or returns "".
func crashLooping(pods []corev1.Pod, restarts int32) string {
	for _, p := range pods {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		for _, c := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			backOff := c.State.Waiting != nil && c.State.Waiting.Reason == "CrashLoopBackOff"
			if !backOff && (c.RestartCount < restarts || c.LastTerminationState.Terminated == nil) {
				continue
			}
			msg := fmt.Sprintf("container %s of pod %s restarted %d time(s)", c.Name, p.Name, c.RestartCount)
			if t := c.LastTerminationState.Terminated; t != nil {
				msg += fmt.Sprintf(", last exit code %d", t.ExitCode)
				if t.Reason != "" {
					msg += " (" + t.Reason + ")"
				}
				if m := strings.TrimSpace(t.Message); m != "" {
					msg += ": " + lastWords(m)
				}
			}
			if w := c.State.Waiting; w != nil && w.Message != "" {
				msg += "; " + w.Reason + ": " + w.Message
			}
			return msg
		}
	}
	return ""
}

// imagePullFailing describes the first container of the pods whose image
// the kubelet cannot pull (a private registry without the right image pull
// Secret, an image that is not there), with the kubelet's words, or
// returns "".
func imagePullFailing(pods []corev1.Pod) string {
	for _, p := range pods {
		for _, c := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			w := c.State.Waiting
			if w == nil || (w.Reason != "ErrImagePull" && w.Reason != "ImagePullBackOff" && w.Reason != "InvalidImageName") {
				continue
			}
			msg := fmt.Sprintf("container %s of pod %s cannot pull its image (%s)", c.Name, p.Name, w.Reason)
			if m := strings.TrimSpace(w.Message); m != "" {
				msg += ": " + lastWords(m)
			}
			return msg
		}
	}
	return ""
}

// maxLastWords bounds the termination message quoted in a condition (a
// container with terminationMessagePolicy FallbackToLogsOnError leaves up to
// 80 lines of its log); its end says why it exited.
const maxLastWords = 1024

func lastWords(m string) string {
	if len(m) <= maxLastWords {
		return m
	}
	return "..." + m[len(m)-maxLastWords:]
}
