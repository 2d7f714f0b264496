package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// ReleaseAs runs `make release` of the repository into the fleet's registry
// under the name of an upstream registry, e.g. ghcr.io/hybrid-ccm (the
// default every chart and docs/deploy manifest names): REGISTRY is
// <Host>/ghcr.io/hybrid-ccm, where the nodes' containerd looks for an image
// named ghcr.io/hybrid-ccm/<name>:<version> (test/registry Mirror). So a
// manifest that names the upstream images, untouched, pulls this release —
// what the static manifests of docs/deploy, which Talos applies, need.
//
// It is registry.Release with another REGISTRY: a subprocess with this
// process's environment, SSL_CERT_FILE naming the registry's CA (with the
// certificates of an SSL_CERT_FILE set before) and the registry's address in
// NO_PROXY; make's output goes to the fleet's log. It then checks that every
// image (ship.Images) is where containerd looks for it.
func (f *Fleet) ReleaseAs(ctx context.Context, upstream, version string) error {
	if version == "" || upstream == "" {
		return errors.New("fleet: release: no version or no registry")
	}
	registry, err := f.MirrorOf(upstream)
	if err != nil {
		return fmt.Errorf("fleet: release as %s: %w", upstream, err)
	}
	caFile, err := f.releaseCAFile()
	if err != nil {
		return fmt.Errorf("fleet: release: %w", err)
	}
	root := testenv.RepoRoot()
	args := []string{"release", "REGISTRY=" + registry, "VERSION=" + version, "PLATFORMS=linux/" + runtime.GOARCH}
	f.logf("make %s (images named %s/<image>:%s on the nodes)", strings.Join(args, " "), upstream, version)
	cmd := exec.CommandContext(ctx, "make", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+caFile)
	if host, _, err := net.SplitHostPort(f.Registry.Host()); err == nil {
		for _, k := range []string{"NO_PROXY", "no_proxy"} {
			cmd.Env = append(cmd.Env, k+"="+strings.Trim(os.Getenv(k)+","+host, ","))
		}
	}
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(f.log, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		tail := out.String()
		if len(tail) > 8<<10 {
			tail = tail[len(tail)-8<<10:]
		}
		return fmt.Errorf("fleet: release: make %s in %s: %w\n%s", strings.Join(args, " "), root, err, tail)
	}
	var missing []error
	for _, img := range ship.Images {
		ref, err := f.Registry.Mirror(ship.ImageRef(upstream, img, version))
		if err != nil {
			return fmt.Errorf("fleet: release: %w", err)
		}
		if _, err := remote.Head(ref, remote.WithContext(ctx), remote.WithTransport(f.Registry.HTTPClient().Transport)); err != nil {
			missing = append(missing, fmt.Errorf("%s: %w", ref, err))
		}
	}
	if err := errors.Join(missing...); err != nil {
		return fmt.Errorf("fleet: release: make release succeeded but the registry lacks:\n%w", err)
	}
	return nil
}

// ChartRefAs is the OCI reference (without version) of a chart ReleaseAs
// pushed for upstream: where a user's `helm install oci://<upstream>/charts/
// <chart>` finds it on the nodes' side of the registry.
func (f *Fleet) ChartRefAs(upstream, chart string) (string, error) {
	registry, err := f.MirrorOf(upstream)
	if err != nil {
		return "", fmt.Errorf("fleet: chart %s as %s: %w", chart, upstream, err)
	}
	return "oci://" + registry + "/charts/" + chart, nil
}

// MirrorOf is where the registry keeps what is named under upstream (a
// registry and repository prefix, e.g. ghcr.io/hybrid-ccm): its host and
// path, as containerd's hosts.toml maps upstream there.
func (f *Fleet) MirrorOf(upstream string) (string, error) {
	probe, err := f.Registry.Mirror(ship.ImageRef(upstream, "x", "0"))
	if err != nil {
		return "", err
	}
	return probe.Context().RegistryStr() + "/" + path.Dir(probe.Context().RepositoryStr()), nil
}

// HasImage reports whether an image, named as the nodes name it (an
// upstream reference, or one on the registry's own host), can be pulled
// from the fleet's registry.
func (f *Fleet) HasImage(ctx context.Context, image string) error {
	ref, err := f.Registry.Mirror(image)
	if err != nil {
		return err
	}
	if _, err := remote.Head(ref, remote.WithContext(ctx), remote.WithTransport(f.Registry.HTTPClient().Transport), remote.WithAuth(f.Registry.Authenticator())); err != nil {
		return fmt.Errorf("image %s (stored as %s): %w", image, ref, err)
	}
	return nil
}

// releaseCAFile is the registry's CA, with the certificates of an
// SSL_CERT_FILE already set before it (Go reads one file).
func (f *Fleet) releaseCAFile() (string, error) {
	prev := os.Getenv("SSL_CERT_FILE")
	if prev == "" {
		return f.Registry.CAFile(), nil
	}
	a, err := os.ReadFile(prev)
	if err != nil {
		return "", fmt.Errorf("SSL_CERT_FILE: %w", err)
	}
	b, err := os.ReadFile(f.Registry.CAFile())
	if err != nil {
		return "", err
	}
	bundle := filepath.Join(f.work, "release-ca-bundle.crt")
	if err := os.WriteFile(bundle, append(append(a, '\n'), b...), 0o644); err != nil {
		return "", err
	}
	return bundle, nil
}

// DecodeManifests reads a multi-document YAML (or JSON) stream of
// Kubernetes objects, such as docs/deploy/*.yaml, in order; empty documents
// are skipped.
func DecodeManifests(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", len(out)+1, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("document %d: no kind or apiVersion", len(out)+1)
		}
		out = append(out, u)
	}
}

// ManifestFieldManager is the field manager ApplyManifests applies with.
const ManifestFieldManager = "talos"

// ApplyManifests does what Talos does with the manifests of
// cluster.externalCloudProvider.manifests (the way docs/install.md says to
// `kubectl apply --server-side` them): it applies every object, in order,
// with server-side apply (field manager ManifestFieldManager, forcing
// conflicts), the namespace of a namespaced object defaulting to
// "default". After a CustomResourceDefinition it waits until the API
// server serves it, so that a later object may be of its kind.
func (f *Fleet) ApplyManifests(ctx context.Context, objs []*unstructured.Unstructured) error {
	dc, err := discovery.NewDiscoveryClientForConfig(f.Config)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(f.Config)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		what := fmt.Sprintf("%s %s", gvk.Kind, obj.GetName())
		var mapping *meta.RESTMapping
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				mapper.Reset() // a kind a CRD just made
				return false, nil
			}
			return true, nil
		}); err != nil {
			return fmt.Errorf("fleet: apply %s: no resource for %s: %v", what, gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if obj.GetNamespace() == "" {
				obj.SetNamespace(corev1.NamespaceDefault)
			}
			ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: ManifestFieldManager, Force: ptrTo(true)}); err != nil {
			return fmt.Errorf("fleet: apply %s: %w", what, err)
		}
		if gvk.GroupKind() == (schema.GroupKind{Group: apiextensionsv1.GroupName, Kind: "CustomResourceDefinition"}) {
			if err := f.waitEstablished(ctx, dyn, obj.GetName()); err != nil {
				return err
			}
			mapper.Reset()
		}
	}
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// waitEstablished waits for a CRD's Established condition.
func (f *Fleet) waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	crds := dyn.Resource(apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions"))
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == string(apiextensionsv1.Established) && m["status"] == string(apiextensionsv1.ConditionTrue) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return fmt.Errorf("fleet: CRD %s not established: %w", name, err)
	}
	return nil
}

// TalosServiceAccounts is the resource of Talos' ServiceAccount kind.
var TalosServiceAccounts = schema.GroupVersionResource{Group: "talos.dev", Version: "v1alpha1", Resource: "serviceaccounts"}

// AnswerTalosServiceAccount does what Talos does for a talos.dev/v1alpha1
// ServiceAccount (machine.features.kubernetesTalosAPIAccess): it waits, as
// long as ctx allows, for the object namespace/name, then writes a Secret of
// the same name holding under "config" a talosconfig for its role, whose
// endpoint is the Talos Service, talos.default (TalosConfig). One role per ServiceAccount.
func (f *Fleet) AnswerTalosServiceAccount(ctx context.Context, namespace, name string) error {
	dyn, err := dynamic.NewForConfig(f.Config)
	if err != nil {
		return err
	}
	var sa *unstructured.Unstructured
	if err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		sa, err = dyn.Resource(TalosServiceAccounts).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("fleet: talos.dev ServiceAccount %s/%s: %w", namespace, name, err)
	}
	roles, _, _ := unstructured.NestedStringSlice(sa.Object, "spec", "roles")
	if len(roles) != 1 {
		return fmt.Errorf("fleet: talos.dev ServiceAccount %s/%s has roles %v: one role is supported", namespace, name, roles)
	}
	config, err := f.TalosConfig(roles[0])
	if err != nil {
		return err
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: map[string][]byte{"config": config}}
	_, err = f.Client.CoreV1().Secrets(namespace).Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = f.Client.CoreV1().Secrets(namespace).Update(ctx, s, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("fleet: answer talos.dev ServiceAccount %s/%s: %w", namespace, name, err)
	}
	f.logf("talos.dev ServiceAccount %s/%s answered: Secret %s with a talosconfig for %s", namespace, name, name, roles[0])
	return nil
}
