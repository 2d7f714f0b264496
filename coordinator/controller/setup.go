package controller

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
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
// labels; Helm reads its storage itself); Pods only from the release namespace
// and only those of native CCM releases (label hybridccm.io/native-ccm),
// without their spec; and Deployments and DaemonSets without the fields the
// coordinator never reads (managed fields, status). Nodes are not in the
// cache: the controller keeps what it reads of them in a nodeStore.
func CacheOptions(namespace string) cache.Options {
	releasePods := labels.SelectorFromSet(nil)
	if req, err := labels.NewRequirement(release.NativeCCMLabel, selection.Exists, nil); err == nil {
		releasePods = releasePods.Add(*req)
	}
	return cache.Options{
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
