package podrunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// podIP is every pod's IP and host IP: pods share the host's network.
const podIP = "127.0.0.1"

// Pod is one running pod: its containers as processes, its Pod object in the
// API server and that object's status.
type Pod struct {
	r        *Runner
	ns, name string
	obj      *corev1.Pod
	dir      string
	hash     string // pod-template-hash
	onChange func()

	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	changed chan struct{}

	mu             sync.Mutex
	volumes        map[string]string
	volumeErr      string
	initContainers []*container
	containers     []*container
	initialized    bool
	started        metav1.Time
	fatal          error // a problem that will not go away (unknown image)
}

// Name of the Pod object.
func (p *Pod) Name() string { return p.name }

// Namespace of the Pod object.
func (p *Pod) Namespace() string { return p.ns }

// UID of the Pod object.
func (p *Pod) UID() string { return string(p.obj.UID) }

// Logs is everything container wrote so far (all its runs).
func (p *Pod) Logs(container string) string {
	for _, c := range p.all() {
		if c.spec.Name == container {
			return c.logs.String()
		}
	}
	return ""
}

// Ready reports whether every container (and native sidecar) is ready.
func (p *Pod) Ready() bool {
	p.mu.Lock()
	initialized := p.initialized
	p.mu.Unlock()
	if !initialized {
		return false
	}
	for _, c := range p.all() {
		if (c.sidecar || !c.init) && !c.isReady() {
			return false
		}
	}
	return true
}

// Err is a reason the pod can never become ready (an image the runner cannot
// resolve), or nil.
func (p *Pod) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fatal
}

// Done is closed once the pod has stopped and its Pod object is gone.
func (p *Pod) Done() <-chan struct{} { return p.done }

// WaitReady waits until the pod is ready, or fails when ctx ends, the pod
// stops, or it can never become ready.
func (p *Pod) WaitReady(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if p.Ready() {
			return nil
		}
		if err := p.Err(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s/%s not ready: %w", p.ns, p.name, ctx.Err())
		case <-p.done:
			return fmt.Errorf("pod %s/%s stopped before it was ready", p.ns, p.name)
		case <-t.C:
		}
	}
}

// Stop stops the pod's containers and deletes its Pod object.
func (p *Pod) Stop() {
	p.cancel()
	<-p.done
}

func (p *Pod) all() []*container {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append(slices.Clone(p.initContainers), p.containers...)
}

func (p *Pod) notify() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
	if p.onChange != nil {
		p.onChange()
	}
}

func (p *Pod) setFatal(err error) {
	p.mu.Lock()
	p.fatal = err
	p.mu.Unlock()
	p.notify()
}

// startPod runs a Pod object the API server holds.
func (r *Runner) startPod(obj *corev1.Pod, hash string, onChange func()) (*Pod, error) {
	dir := filepath.Join(r.opts.Dir, obj.Namespace+"_"+obj.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", podIP, obj.Name)
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts), 0o644); err != nil {
		return nil, err
	}
	p := &Pod{
		r: r, ns: obj.Namespace, name: obj.Name, obj: obj, dir: dir, hash: hash, onChange: onChange,
		done: make(chan struct{}), changed: make(chan struct{}, 1), started: metav1.Now().Rfc3339Copy(),
	}
	p.ctx, p.cancel = context.WithCancel(r.ctx)
	for _, c := range obj.Spec.InitContainers {
		p.initContainers = append(p.initContainers, newContainer(p, c, true))
	}
	for _, c := range obj.Spec.Containers {
		p.containers = append(p.containers, newContainer(p, c, false))
	}
	r.go_(p.run)
	r.go_(p.statusLoop)
	return p, nil
}

// run is the pod's life: volumes, init containers and native sidecars in
// order, app containers; on stop app containers first, sidecars last (in
// reverse order); then the Pod object goes.
func (p *Pod) run() {
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := p.r.client.CoreV1().Pods(p.ns).Delete(ctx, p.name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &p.obj.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			fmt.Fprintf(p.r.opts.Log, "%s/%s: delete pod: %v\n", p.ns, p.name, err)
		}
		close(p.done)
		if p.onChange != nil {
			p.onChange()
		}
	}()
	for {
		vols, err := p.prepareVolumes(p.ctx)
		p.mu.Lock()
		p.volumes = vols
		if err != nil {
			p.volumeErr = err.Error()
		} else {
			p.volumeErr = ""
		}
		p.mu.Unlock()
		p.notify()
		if err == nil {
			break
		}
		fmt.Fprintf(p.r.opts.Log, "%s/%s: volumes: %v\n", p.ns, p.name, err)
		if !sleep(p.ctx, p.r.opts.SyncPeriod) {
			return
		}
	}
	var sidecars, apps []*container
	stopAll := func() {
		stopInParallel(apps)
		for i := len(sidecars) - 1; i >= 0; i-- {
			sidecars[i].stop()
		}
	}
	for _, c := range p.initContainers {
		if c.sidecar {
			sidecars = append(sidecars, c)
			c.start(false)
			if !c.waitStarted(p.ctx) {
				stopAll()
				return
			}
			continue
		}
		c.start(true)
		if !c.waitCompleted(p.ctx) {
			c.stop()
			stopAll()
			return
		}
	}
	p.mu.Lock()
	p.initialized = true
	p.mu.Unlock()
	p.notify()
	for _, c := range p.containers {
		apps = append(apps, c)
		c.start(false)
	}
	<-p.ctx.Done()
	stopAll()
}

func stopInParallel(cs []*container) {
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.stop()
		}()
	}
	wg.Wait()
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// statusLoop keeps the Pod object's status current and notices when someone
// else deletes the Pod.
func (p *Pod) statusLoop() {
	t := time.NewTicker(p.r.opts.SyncPeriod)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-p.changed:
		case <-t.C:
		}
		if err := p.writeStatus(); err != nil && p.ctx.Err() == nil {
			fmt.Fprintf(p.r.opts.Log, "%s/%s: status: %v\n", p.ns, p.name, err)
		}
	}
}

var errGone = errors.New("pod deleted")

func (p *Pod) writeStatus() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods := p.r.client.CoreV1().Pods(p.ns)
	cur, err := pods.Get(ctx, p.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && (cur.UID != p.obj.UID || cur.DeletionTimestamp != nil)) {
		p.cancel() // deleted by someone else: stop, like a kubelet
		return nil
	}
	if err != nil {
		return err
	}
	st := p.status(cur.Status)
	if equality.Semantic.DeepEqual(st, cur.Status) {
		return nil
	}
	cur.Status = st
	_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		p.notify()
		return nil
	}
	return err
}

// status derives the Pod status from the containers; prev keeps condition
// transition times.
func (p *Pod) status(prev corev1.PodStatus) corev1.PodStatus {
	p.mu.Lock()
	initialized, volumeErr, haveVolumes := p.initialized, p.volumeErr, p.volumes != nil
	p.mu.Unlock()
	st := corev1.PodStatus{
		Phase:     corev1.PodPending,
		HostIP:    podIP,
		HostIPs:   []corev1.HostIP{{IP: podIP}},
		PodIP:     podIP,
		PodIPs:    []corev1.PodIP{{IP: podIP}},
		StartTime: &p.started,
		QOSClass:  prev.QOSClass,
	}
	ready := initialized
	for _, c := range p.initContainers {
		cs := c.status()
		st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
		if c.sidecar && !cs.Ready {
			ready = false
		}
	}
	for _, c := range p.containers {
		cs := c.status()
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
		if !cs.Ready {
			ready = false
		}
		if cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil {
			st.Phase = corev1.PodRunning
		}
	}
	cond := func(t corev1.PodConditionType, ok bool, reason string) {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason}
		if ok {
			c.Status, c.Reason = corev1.ConditionTrue, ""
		}
		c.LastTransitionTime = metav1.Now().Rfc3339Copy()
		for _, old := range prev.Conditions {
			if old.Type == t && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		st.Conditions = append(st.Conditions, c)
	}
	cond(corev1.PodReadyToStartContainers, volumeErr == "" && haveVolumes, "")
	cond(corev1.PodInitialized, initialized, "ContainersNotInitialized")
	cond(corev1.ContainersReady, ready, "ContainersNotReady")
	cond(corev1.PodReady, ready, "ContainersNotReady")
	cond(corev1.PodScheduled, true, "")
	return st
}
