// Package cleanup removes what the coordinator installed for one native CCM
// when the coordinator cannot (it is gone, or the NativeCCM hangs in
// Terminating): every object carrying the labels the coordinator sets on a
// release's objects, then the release's Helm records. It never runs Helm:
// a record the coordinator wrote is never trusted input (its hooks and the
// objects its manifest lists would run and be deleted with the rights of
// whoever runs Helm on it). It must not delete anything the coordinator did
// not label as that release's.
package cleanup

import (
	"context"
	"fmt"
	"k8s.io/apimachinery/pkg/util/validation"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// Kinds are what a native CCM release may hold (the native-ccm chart, the
// coordinator's mutators and the gate), looked for in every namespace.
var Kinds = []schema.GroupVersionKind{
	{Group: "apps", Version: "v1", Kind: "Deployment"},
	{Group: "apps", Version: "v1", Kind: "DaemonSet"},
	{Version: "v1", Kind: "ServiceAccount"},
	{Version: "v1", Kind: "ConfigMap"},
	{Version: "v1", Kind: "Secret"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"},
	{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"},
	{Group: "networking.k8s.io", Version: "v1", Kind: "NetworkPolicy"},
	{Group: "policy", Version: "v1", Kind: "PodDisruptionBudget"},
}

// Options tune NativeCCM.
type Options struct {
	// Namespace is the coordinator's namespace, where the release's Helm
	// records are.
	Namespace string
	// DryRun lists what would be deleted and deletes nothing.
	DryRun bool
}

// NativeCCM deletes the objects of NativeCCM name's release (labelled
// hybridccm.io/managed-by=ccm-coordinator and
// hybridccm.io/native-ccm=native-ccm-<name>), then its Helm records in
// o.Namespace, and returns what it deleted ("Kind namespace/name").
func NativeCCM(ctx context.Context, c client.Client, name string, o Options) ([]string, error) {
	const op = "cleanup.NativeCCM"
	if name == "" || o.Namespace == "" {
		return nil, fmt.Errorf("%s: a NativeCCM name and the coordinator's namespace are required", op)
	}
	rel := v1.ReleasePrefix + name
	// name goes into label selectors: it must be what a NativeCCM's name can
	// be and make a label value, never selector syntax
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return nil, fmt.Errorf("%s: NativeCCM name %q: %s", op, name, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsValidLabelValue(rel); len(msgs) > 0 {
		return nil, fmt.Errorf("%s: NativeCCM name %q: its release name %q is no label value: %s", op, name, rel, strings.Join(msgs, "; "))
	}
	var deleted []string
	remove := func(obj *unstructured.Unstructured) error {
		deleted = append(deleted, fmt.Sprintf("%s %s/%s", obj.GetKind(), obj.GetNamespace(), obj.GetName()))
		if o.DryRun {
			return nil
		}
		if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s: delete %s %s/%s: %w", op, obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
		return nil
	}
	for _, gvk := range Kinds {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := c.List(ctx, &list, client.MatchingLabels{release.ManagedByLabel: release.ManagedByValue, release.NativeCCMLabel: rel}); err != nil {
			return deleted, fmt.Errorf("%s: list %s: %w", op, gvk.Kind, err)
		}
		for i := range list.Items {
			if err := remove(&list.Items[i]); err != nil {
				return deleted, err
			}
		}
	}
	var records unstructured.UnstructuredList
	records.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "SecretList"})
	if err := c.List(ctx, &records, client.InNamespace(o.Namespace),
		client.MatchingLabels{release.StorageOwnerLabel: release.StorageOwner, release.StorageNameLabel: rel}); err != nil {
		return deleted, fmt.Errorf("%s: list release records: %w", op, err)
	}
	for i := range records.Items {
		if typ, _, _ := unstructured.NestedString(records.Items[i].Object, "type"); typ != release.HelmStorageType {
			continue
		}
		if err := remove(&records.Items[i]); err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}
