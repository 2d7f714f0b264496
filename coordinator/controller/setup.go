package controller

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// NewScheme returns the types the coordinator reads and writes.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1.AddToScheme(s))
	return s
}

// CacheOptions keeps the manager's cache small: Secrets only from the release
// namespace, and of Helm's release Secrets only the metadata (the release
// step reads a release's latest revision, status and digest from their
// labels; Helm reads its storage itself); of Nodes only what the coordinator
// reads (nodeSkeleton: a few hundred bytes per node, however many labels,
// annotations and images a node has); Pods only from the release namespace
// and only those of native CCM releases (label hybridccm.io/native-ccm),
// without their spec; and Deployments and DaemonSets without the fields the
// coordinator never reads (managed fields, status).
func CacheOptions(namespace string) cache.Options {
	releasePods := labels.SelectorFromSet(nil)
	if req, err := labels.NewRequirement(release.NativeCCMLabel, selection.Exists, nil); err == nil {
		releasePods = releasePods.Add(*req)
	}
	return cache.Options{
		NewInformer:      newInformer,
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Namespaces: map[string]cache.Config{namespace: {}}, Transform: func(in any) (any, error) {
				if s, ok := in.(*corev1.Secret); ok {
					s.ManagedFields = nil
					if s.Type == release.HelmStorageType {
						s.Data, s.StringData = nil, nil
					}
				}
				return in, nil
			}},
			&corev1.Pod{}: {
				Namespaces: map[string]cache.Config{namespace: {}},
				Label:      releasePods,
				Transform: func(in any) (any, error) {
					if p, ok := in.(*corev1.Pod); ok {
						p.ManagedFields = nil
						p.Spec = corev1.PodSpec{}
					}
					return in, nil
				},
			},
			&corev1.Node{}: {Transform: func(in any) (any, error) {
				if n, ok := in.(*corev1.Node); ok {
					*n = nodeSkeleton(n)
				}
				return in, nil
			}},
			&appsv1.Deployment{}: {Transform: stripStatus},
			&appsv1.DaemonSet{}:  {Transform: stripStatus},
		},
	}
}

func stripStatus(in any) (any, error) {
	switch o := in.(type) {
	case *appsv1.Deployment:
		o.ManagedFields, o.Status = nil, appsv1.DeploymentStatus{}
	case *appsv1.DaemonSet:
		o.ManagedFields, o.Status = nil, appsv1.DaemonSetStatus{}
	}
	return in, nil
}

// nodeSkeleton is what the coordinator reads of a Node: its name and
// identity, its platform label and its providerID.
func nodeSkeleton(n *corev1.Node) corev1.Node {
	out := corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
			CreationTimestamp: n.CreationTimestamp, DeletionTimestamp: n.DeletionTimestamp,
		},
		Spec: corev1.NodeSpec{ProviderID: n.Spec.ProviderID},
	}
	if p, ok := n.Labels[names.PlatformLabel]; ok {
		out.Labels = map[string]string{names.PlatformLabel: p}
	}
	return out
}

// nodePageSize bounds how many whole Nodes the cache decodes at once.
const nodePageSize = 250

// newInformer is the cache's informer constructor: Nodes are listed in
// pages (pagedNodes), everything else as controller-runtime does.
func newInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, idx toolscache.Indexers) toolscache.SharedIndexInformer {
	if _, ok := obj.(*corev1.Node); ok {
		lw = pagedNodes{toolscache.ToListerWatcherWithContext(lw)}
	}
	return toolscache.NewSharedIndexInformer(lw, obj, resync, idx)
}

// pagedNodes lists Nodes as a consistent read in pages of nodePageSize,
// each page cut down to nodeSkeleton before the next is read. A list at
// resourceVersion 0 (the informer's first) would come from the API server's
// watch cache in one piece: every node whole, at once, before the cache's
// transform sees any of them. Watch events come one node at a time and the
// cache's transform cuts them.
type pagedNodes struct {
	lw toolscache.ListerWatcherWithContext
}

var (
	_ toolscache.ListerWatcher            = pagedNodes{}
	_ toolscache.ListerWatcherWithContext = pagedNodes{}
)

func (p pagedNodes) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	o.ResourceVersion, o.ResourceVersionMatch = "", ""
	if o.Limit == 0 || o.Limit > nodePageSize {
		o.Limit = nodePageSize
	}
	out, err := p.lw.ListWithContext(ctx, o)
	if l, ok := out.(*corev1.NodeList); ok && err == nil {
		for i := range l.Items {
			l.Items[i] = nodeSkeleton(&l.Items[i])
		}
	}
	return out, err
}

func (p pagedNodes) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return p.lw.WatchWithContext(ctx, o)
}

func (p pagedNodes) List(o metav1.ListOptions) (runtime.Object, error) {
	return p.ListWithContext(context.Background(), o)
}

func (p pagedNodes) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return p.WatchWithContext(context.Background(), o)
}
