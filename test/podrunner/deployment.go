package podrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// podTemplateHashLabel is the deployment controller's label on ReplicaSets and pods.
const podTemplateHashLabel = "pod-template-hash"

// Deployment keeps one Deployment's pods running from its current template,
// with a ReplicaSet per template and the status the deployment and replica
// set controllers would write.
type Deployment struct {
	r        *Runner
	ns, name string
	poke     chan struct{}
	done     chan struct{}

	mu   sync.Mutex
	pods []*Pod
	err  error
	// desired and current template hash, as last seen.
	desired int
	hash    string
	gone    bool
}

// RunDeployment runs the pods of Deployment ns/name until it is deleted or
// the runner stops; a template change rolls them (new pods first, old ones
// once the new are ready; Recreate stops the old first).
func (r *Runner) RunDeployment(ctx context.Context, ns, name string) (*Deployment, error) {
	if _, err := r.client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
		return nil, fmt.Errorf("podrunner: deployment %s/%s: %w", ns, name, err)
	}
	return r.deployment(ns, name), nil
}

// Deployment is the runner's handle of ns/name, or nil when it runs no such
// Deployment (yet).
func (r *Runner) Deployment(ns, name string) *Deployment {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deployments[ns+"/"+name]
}

func (r *Runner) deployment(ns, name string) *Deployment {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := ns + "/" + name
	if d, ok := r.deployments[key]; ok {
		d.kick()
		return d
	}
	d := &Deployment{r: r, ns: ns, name: name, poke: make(chan struct{}, 1), done: make(chan struct{})}
	r.deployments[key] = d
	d.kick()
	r.go_(d.run)
	return d
}

func (d *Deployment) kick() {
	select {
	case d.poke <- struct{}{}:
	default:
	}
}

// Done is closed once the runner has let go of the Deployment (deleted, or
// the runner stopped) and stopped its pods.
func (d *Deployment) Done() <-chan struct{} { return d.done }

// Pods are the running pods, current template first.
func (d *Deployment) Pods() []*Pod {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := slices.Clone(d.pods)
	slices.SortStableFunc(out, func(a, b *Pod) int {
		if (a.hash == d.hash) == (b.hash == d.hash) {
			return 0
		}
		if a.hash == d.hash {
			return -1
		}
		return 1
	})
	return out
}

// WaitReady waits until the Deployment runs exactly spec.replicas pods of its
// current template, all ready, and returns them. It fails early when a pod
// can never become ready (an unknown image).
func (d *Deployment) WaitReady(ctx context.Context) ([]*Pod, error) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		d.mu.Lock()
		pods, hash, desired, err := slices.Clone(d.pods), d.hash, d.desired, d.err
		d.mu.Unlock()
		ok := hash != "" && len(pods) == desired
		for _, p := range pods {
			if perr := p.Err(); perr != nil {
				return nil, perr
			}
			ok = ok && p.hash == hash && p.Ready()
		}
		if ok {
			return pods, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("deployment %s/%s: %d/%d pods of the current template ready: %w", d.ns, d.name, countReady(pods, hash), desired, err)
		case <-d.done:
			return nil, fmt.Errorf("deployment %s/%s is gone", d.ns, d.name)
		case <-t.C:
		}
	}
}

func countReady(pods []*Pod, hash string) int {
	n := 0
	for _, p := range pods {
		if p.hash == hash && p.Ready() {
			n++
		}
	}
	return n
}

func (d *Deployment) run() {
	defer close(d.done)
	defer func() {
		d.r.mu.Lock()
		delete(d.r.deployments, d.ns+"/"+d.name)
		d.r.mu.Unlock()
	}()
	t := time.NewTicker(d.r.opts.SyncPeriod)
	defer t.Stop()
	for {
		err := d.sync()
		d.mu.Lock()
		d.err = err
		gone := d.gone
		d.mu.Unlock()
		if err != nil && d.r.ctx.Err() == nil {
			fmt.Fprintf(d.r.opts.Log, "deployment %s/%s: %v\n", d.ns, d.name, err)
		}
		if gone {
			d.stopPods(d.Pods())
			return
		}
		select {
		case <-d.r.ctx.Done():
			d.stopPods(d.Pods())
			return
		case <-d.poke:
		case <-t.C:
		}
	}
}

func (d *Deployment) stopPods(pods []*Pod) {
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop()
		}()
	}
	wg.Wait()
	d.prune()
}

// prune forgets pods that have stopped.
func (d *Deployment) prune() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pods = slices.DeleteFunc(d.pods, func(p *Pod) bool {
		select {
		case <-p.done:
			return true
		default:
			return false
		}
	})
}

// templateHash names a pod template (the deployment controller's
// pod-template-hash plays the same role).
func templateHash(t *corev1.PodTemplateSpec) string {
	b, _ := json.Marshal(t)
	h := fnv.New32a()
	_, _ = h.Write(b)
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}

// sync does one round of the deployment and replica set controllers' work.
func (d *Deployment) sync() error {
	ctx, cancel := context.WithTimeout(d.r.ctx, 30*time.Second)
	defer cancel()
	dep, err := d.r.client.AppsV1().Deployments(d.ns).Get(ctx, d.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && dep.DeletionTimestamp != nil) {
		d.mu.Lock()
		d.gone = true
		d.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	desired := int(ptr.Deref(dep.Spec.Replicas, 1))
	hash := templateHash(&dep.Spec.Template)
	d.prune()
	d.mu.Lock()
	d.desired, d.hash = desired, hash
	var cur, old []*Pod
	for _, p := range d.pods {
		if p.hash == hash {
			cur = append(cur, p)
		} else {
			old = append(old, p)
		}
	}
	d.mu.Unlock()

	rs, err := d.replicaSet(ctx, dep, hash)
	if err != nil {
		return err
	}
	recreate := dep.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType
	switch {
	case len(old) > 0 && (recreate || desired == 0):
		d.stopPods(old)
		old = nil
	case len(old) > 0 && countReady(cur, hash) >= desired:
		d.stopPods(old) // the new pods are ready: the rollout is done
		old = nil
	}
	if len(cur) > desired {
		d.stopPods(cur[desired:])
		cur = cur[:desired]
	}
	for len(cur) < desired && (!recreate || len(old) == 0) {
		p, err := d.createPod(ctx, dep, rs, hash)
		if err != nil {
			return err
		}
		cur = append(cur, p)
		d.mu.Lock()
		d.pods = append(d.pods, p)
		d.mu.Unlock()
	}
	return d.writeStatus(ctx, dep, rs, cur, old)
}

// replicaSet finds or creates the ReplicaSet of the current template.
func (d *Deployment) replicaSet(ctx context.Context, dep *appsv1.Deployment, hash string) (*appsv1.ReplicaSet, error) {
	name := dep.Name + "-" + hash
	rss := d.r.client.AppsV1().ReplicaSets(d.ns)
	rs, err := rss.Get(ctx, name, metav1.GetOptions{})
	if err == nil || !apierrors.IsNotFound(err) {
		return rs, err
	}
	tpl := *dep.Spec.Template.DeepCopy()
	tpl.Labels = maps.Clone(tpl.Labels)
	if tpl.Labels == nil {
		tpl.Labels = map[string]string{}
	}
	tpl.Labels[podTemplateHashLabel] = hash
	sel := dep.Spec.Selector.DeepCopy()
	if sel.MatchLabels == nil {
		sel.MatchLabels = map[string]string{}
	}
	sel.MatchLabels[podTemplateHashLabel] = hash
	rs = &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: d.ns, Labels: tpl.Labels, Annotations: map[string]string{},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(dep, appsv1.SchemeGroupVersion.WithKind("Deployment"))},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: dep.Spec.Replicas, Selector: sel, Template: tpl, MinReadySeconds: dep.Spec.MinReadySeconds},
	}
	rs, err = rss.Create(ctx, rs, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return rss.Get(ctx, name, metav1.GetOptions{})
	}
	return rs, err
}

// createPod creates the Pod object (what the replica set controller and the
// scheduler would) with the API access volume the ServiceAccount admission
// plugin would add, and runs it.
func (d *Deployment) createPod(ctx context.Context, dep *appsv1.Deployment, rs *appsv1.ReplicaSet, hash string) (*Pod, error) {
	tpl := rs.Spec.Template.DeepCopy()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: rs.Name + "-", Namespace: d.ns, Labels: tpl.Labels, Annotations: tpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))},
		},
		Spec: tpl.Spec,
	}
	pod.Spec.NodeName = d.r.opts.NodeName
	if err := d.r.admitServiceAccount(ctx, pod); err != nil {
		return nil, err
	}
	obj, err := d.r.client.CoreV1().Pods(d.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod of %s: %w", rs.Name, err)
	}
	return d.r.startPod(obj, hash, d.kick)
}

// admitServiceAccount does the ServiceAccount admission plugin's and the
// service account and root CA publisher controllers' part: the default
// ServiceAccount and kube-root-ca.crt exist, and unless automount is off (pod,
// else ServiceAccount), every container mounts the API access volume.
func (r *Runner) admitServiceAccount(ctx context.Context, pod *corev1.Pod) error {
	if pod.Spec.ServiceAccountName == "" {
		pod.Spec.ServiceAccountName = "default"
	}
	sas := r.client.CoreV1().ServiceAccounts(pod.Namespace)
	sa, err := sas.Get(ctx, pod.Spec.ServiceAccountName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && pod.Spec.ServiceAccountName == "default" {
		sa, err = sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			sa, err = sas.Get(ctx, "default", metav1.GetOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("error looking up service account %s/%s: %w", pod.Namespace, pod.Spec.ServiceAccountName, err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": string(r.caData)}}
	if _, err := r.client.CoreV1().ConfigMaps(pod.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("publish kube-root-ca.crt: %w", err)
	}
	automount := ptr.Deref(sa.AutomountServiceAccountToken, true)
	if pod.Spec.AutomountServiceAccountToken != nil {
		automount = *pod.Spec.AutomountServiceAccountToken
	}
	if !automount {
		return nil
	}
	name := "kube-api-access-" + rand.String(5)
	pod.Spec.Volumes = append(pod.Spec.Volumes, apiAccessVolume(name))
	mount := func(cs []corev1.Container) {
		for i := range cs {
			if slices.ContainsFunc(cs[i].VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == serviceAccountDir }) {
				continue
			}
			cs[i].VolumeMounts = append(cs[i].VolumeMounts, corev1.VolumeMount{Name: name, MountPath: serviceAccountDir, ReadOnly: true})
		}
	}
	mount(pod.Spec.InitContainers)
	mount(pod.Spec.Containers)
	return nil
}

// writeStatus writes what the replica set and deployment controllers would.
func (d *Deployment) writeStatus(ctx context.Context, dep *appsv1.Deployment, rs *appsv1.ReplicaSet, cur, old []*Pod) error {
	ready := func(ps []*Pod) int32 {
		n := int32(0)
		for _, p := range ps {
			if p.Ready() {
				n++
			}
		}
		return n
	}
	curReady, oldReady := ready(cur), ready(old)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := d.r.client.AppsV1().ReplicaSets(d.ns).Get(ctx, rs.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := appsv1.ReplicaSetStatus{
			Replicas: int32(len(cur)), FullyLabeledReplicas: int32(len(cur)),
			ReadyReplicas: curReady, AvailableReplicas: curReady, ObservedGeneration: got.Generation,
		}
		if equality.Semantic.DeepEqual(got.Status, st) {
			return nil
		}
		got.Status = st
		_, err = d.r.client.AppsV1().ReplicaSets(d.ns).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("replicaset %s status: %w", rs.Name, err)
	}
	desired := int32(ptr.Deref(dep.Spec.Replicas, 1))
	total := int32(len(cur) + len(old))
	avail := curReady + oldReady
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := d.r.client.AppsV1().Deployments(d.ns).Get(ctx, d.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := appsv1.DeploymentStatus{
			ObservedGeneration:  got.Generation,
			Replicas:            total,
			UpdatedReplicas:     int32(len(cur)),
			ReadyReplicas:       avail,
			AvailableReplicas:   avail,
			UnavailableReplicas: max(0, desired-avail),
			CollisionCount:      got.Status.CollisionCount,
		}
		now := metav1.Now().Rfc3339Copy()
		cond := func(t appsv1.DeploymentConditionType, ok bool, reason, msg string) {
			c := appsv1.DeploymentCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: msg, LastUpdateTime: now, LastTransitionTime: now}
			if ok {
				c.Status = corev1.ConditionTrue
			}
			for _, o := range got.Status.Conditions {
				if o.Type == t && o.Status == c.Status {
					c.LastTransitionTime = o.LastTransitionTime
					if o.Reason == c.Reason {
						c.LastUpdateTime = o.LastUpdateTime
					}
				}
			}
			st.Conditions = append(st.Conditions, c)
		}
		if avail >= desired {
			cond(appsv1.DeploymentAvailable, true, "MinimumReplicasAvailable", "Deployment has minimum availability.")
		} else {
			cond(appsv1.DeploymentAvailable, false, "MinimumReplicasUnavailable", "Deployment does not have minimum availability.")
		}
		if int32(len(cur)) == desired && curReady == desired && len(old) == 0 {
			cond(appsv1.DeploymentProgressing, true, "NewReplicaSetAvailable", fmt.Sprintf("ReplicaSet %q has successfully progressed.", rs.Name))
		} else {
			cond(appsv1.DeploymentProgressing, true, "ReplicaSetUpdated", fmt.Sprintf("ReplicaSet %q is progressing.", rs.Name))
		}
		if statusEqual(got.Status, st) {
			return nil
		}
		got.Status = st
		_, err = d.r.client.AppsV1().Deployments(d.ns).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
}

func statusEqual(a, b appsv1.DeploymentStatus) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
