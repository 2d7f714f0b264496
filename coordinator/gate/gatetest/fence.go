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

// CRDs is the directory of the NativeCCM CRD.
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
// ccm-coordinator chart does: with the providerID prefixes of the built-in
// profiles, and those Confine added to a fence already there.
func InstallFence(ctx context.Context, c client.Client, namespace string) error {
	return installFence(ctx, c, gate.Fence{Namespace: namespace}, "", nil)
}

// installFence (re)writes the fence with the prefix table it has (the
// built-in profiles' when it is absent or of another namespace) plus
// prefixes for platform.
func installFence(ctx context.Context, c client.Client, f gate.Fence, platform string, prefixes []string) error {
	installed, err := gate.ReadFence(ctx, c, f)
	table := installed.Prefixes
	if err != nil {
		if table, err = gate.BuiltinPrefixes(); err != nil {
			return err
		}
	}
	if platform != "" {
		table[platform] = append(table[platform], prefixes...)
	}
	f.ProviderIDPrefixes = table
	_, err = gate.EnsureFence(ctx, c, f)
	return err
}

// Confine makes NativeCCM name one the fence confines, as an admin (or the
// hybrid-ccm chart) and the ccm-coordinator chart leave it: the NativeCCM
// with spec.platform, its grant for the ServiceAccount native-ccm-<name> of
// the fence's namespace, and the fence itself (installed if absent) knowing
// prefixes as the platform's providerID prefixes besides those it has. The
// NativeCCM has install Never, so that a running coordinator leaves it alone.
// It returns a function that deletes the NativeCCM and its grant.
func Confine(ctx context.Context, c client.Client, f gate.Fence, name, platform string, prefixes ...string) (func(), error) {
	obj := &v1.NativeCCM{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NativeCCMSpec{Platform: platform, Install: v1.InstallNever},
	}
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("NativeCCM %s: %w", name, err)
	}
	remove := func() {
		_ = gate.DeleteGrant(context.Background(), c, name)
		_ = c.Delete(context.Background(), &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	if err := gate.EnsureGrant(ctx, c, gate.Grant{NativeCCM: name, Namespace: f.Namespace, Platform: platform}); err != nil {
		return remove, err
	}
	if len(prefixes) > 0 {
		if err := installFence(ctx, c, f, platform, prefixes); err != nil {
			return remove, err
		}
	}
	return remove, nil
}

// FenceLoadBalancers sets spec.loadBalancers of NativeCCM name and its grant
// (for the ServiceAccount of namespace) to match, as an admin (or the
// hybrid-ccm chart) does.
func FenceLoadBalancers(ctx context.Context, c client.Client, namespace, name string, lb v1.LoadBalancers) error {
	// Every field spelled out: a merge patch keeps what it does not mention.
	var class any
	if lb.Class != "" {
		class = lb.Class
	}
	spec, err := json.Marshal(map[string]any{"spec": map[string]any{"loadBalancers": map[string]any{"enabled": lb.Enabled, "class": class, "default": lb.Default}}})
	if err != nil {
		return err
	}
	obj := &v1.NativeCCM{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, spec)); err != nil {
		return fmt.Errorf("NativeCCM %s spec.loadBalancers: %w", name, err)
	}
	return gate.EnsureGrant(ctx, c, gate.GrantFor(obj, namespace))
}
