package podrunner

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Manage runs every Deployment in namespace ns (empty: all namespaces)
// matching selector (e.g. "hybridccm.io/managed-by=ccm-coordinator"; empty:
// all): started when created, rolled when the template changes, stopped when
// deleted or scaled to 0. It returns once the existing Deployments are
// listed; it stops with ctx or the runner.
func (r *Runner) Manage(ctx context.Context, ns, selector string) error {
	if _, err := labels.Parse(selector); err != nil {
		return fmt.Errorf("podrunner: selector %q: %w", selector, err)
	}
	deps := r.client.AppsV1().Deployments(ns)
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return deps.List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return deps.Watch(ctx, o)
		},
	}
	on := func(obj any) {
		if d, ok := obj.(*appsv1.Deployment); ok {
			r.deployment(d.Namespace, d.Name)
		}
	}
	_, inf := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &appsv1.Deployment{},
		ResyncPeriod:  time.Minute,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    on,
			UpdateFunc: func(_, obj any) { on(obj) },
			DeleteFunc: func(obj any) {
				if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				if d, ok := obj.(*appsv1.Deployment); ok {
					if h := r.Deployment(d.Namespace, d.Name); h != nil {
						h.kick()
					}
				}
			},
		},
	})
	stop := make(chan struct{})
	r.go_(func() {
		defer close(stop)
		select {
		case <-ctx.Done():
		case <-r.ctx.Done():
		}
	})
	go inf.Run(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		return fmt.Errorf("podrunner: list deployments in %q: %w", ns, context.Cause(ctx))
	}
	return nil
}
