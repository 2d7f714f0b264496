package gatetest

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// CRDs is the directory of the NativeCCM CRD, which the fence takes its
// parameters from: a control plane that runs the fence installs it.
func CRDs() string {
	return filepath.Join(testenv.RepoRoot(), "charts", "ccm-coordinator", "crds")
}

// Client is an admin controller-runtime client that knows NativeCCMs.
func Client(cfg *rest.Config) (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// InstallFence installs the fence for the native CCMs of namespace, as the
// ccm-coordinator chart does.
func InstallFence(ctx context.Context, c client.Client, namespace string) error {
	_, err := gate.EnsureFence(ctx, c, gate.Fence{Namespace: namespace})
	return err
}

// FenceParam makes NativeCCM name the fence's parameter for the ServiceAccount
// native-ccm-<name>, as the coordinator leaves it: spec.platform, and
// status.gate with the providerID prefixes (none: status.gate stays empty).
// The NativeCCM has install Never, so that a running coordinator leaves it
// alone. It returns a function that deletes it.
func FenceParam(ctx context.Context, c client.Client, name, platform string, prefixes ...string) (func(), error) {
	obj := &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NativeCCMSpec{Platform: platform, Install: v1.InstallNever},
	}
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("NativeCCM %s: %w", name, err)
	}
	remove := func() { _ = c.Delete(context.Background(), &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}}) }
	if len(prefixes) > 0 {
		body, err := json.Marshal(map[string]any{"status": map[string]any{"gate": v1.GateStatus{
			Policy: gate.DefaultFenceName, ProviderIDPrefixes: prefixes,
		}}})
		if err != nil {
			return remove, err
		}
		if err := c.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, body)); err != nil {
			return remove, fmt.Errorf("NativeCCM %s status.gate: %w", name, err)
		}
	}
	return remove, nil
}

// FenceLoadBalancers sets spec.loadBalancers of NativeCCM name (what an admin
// asks for) and status.gate.loadBalancers (what the coordinator grants; nil:
// nothing granted).
func FenceLoadBalancers(ctx context.Context, c client.Client, name string, lb v1.LoadBalancers, granted *v1.GateLoadBalancers) error {
	spec, err := json.Marshal(map[string]any{"spec": map[string]any{"loadBalancers": lb}})
	if err != nil {
		return err
	}
	obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, spec)); err != nil {
		return fmt.Errorf("NativeCCM %s spec.loadBalancers: %w", name, err)
	}
	// Every field spelled out: a merge patch keeps what it does not mention.
	var g any
	if granted != nil {
		g = map[string]any{"class": granted.Class, "default": granted.Default}
	}
	status, err := json.Marshal(map[string]any{"status": map[string]any{"gate": map[string]any{"loadBalancers": g}}})
	if err != nil {
		return err
	}
	if err := c.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, status)); err != nil {
		return fmt.Errorf("NativeCCM %s status.gate.loadBalancers: %w", name, err)
	}
	return nil
}
