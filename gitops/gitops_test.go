// Package gitops_test checks the Flux repository layout under gitops/: every
// kustomization builds in-process (kustomize's krusty, as kustomize-controller
// does), every Flux object decodes strictly into Flux's own API types, no
// Secret is stored in clear, each environment's values render the hybrid-ccm
// chart, whose objects a real API server accepts (server-side dry-run), and ship
// the credentials its NativeCCMs need, and the NativeCCM health-check
// expressions are evaluated by Flux's own CEL status evaluator.
package gitops_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship/publish"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// root is the gitops directory: the root of the Git repository Flux syncs.
func root() string { return filepath.Join(testenv.RepoRoot(), "gitops") }

// build is the output of one kustomization.
type build struct {
	dir     string // relative to root()
	objects []*unstructured.Unstructured
}

// kustomizations lists every directory under gitops/ that has a kustomization.yaml.
func kustomizations(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root(), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == "kustomization.yaml" {
			rel, _ := filepath.Rel(root(), filepath.Dir(p))
			dirs = append(dirs, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 7 {
		t.Fatalf("only %d kustomizations found under %s: %v", len(dirs), root(), dirs)
	}
	return dirs
}

// kustomizeBuild is `kustomize build <dir>` with the defaults Flux uses
// (no files from outside the kustomization's root).
func kustomizeBuild(dir string) (build, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root(), dir))
	if err != nil {
		return build{}, err
	}
	b := build{dir: dir}
	for _, r := range rm.Resources() {
		js, err := r.MarshalJSON()
		if err != nil {
			return build{}, err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return build{}, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		b.objects = append(b.objects, u)
	}
	return b, nil
}

// builds builds every kustomization, failing the test on any error.
func builds(t *testing.T) map[string]build {
	t.Helper()
	out := map[string]build{}
	for _, dir := range kustomizations(t) {
		b, err := kustomizeBuild(dir)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", dir, err)
		}
		out[dir] = b
	}
	return out
}

func (b build) find(apiVersion, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range b.objects {
		if o.GetKind() == kind && (apiVersion == "" || o.GetAPIVersion() == apiVersion) {
			out = append(out, o)
		}
	}
	return out
}

// TestKustomizeBuild: every kustomization under gitops/ builds and produces objects.
func TestKustomizeBuild(t *testing.T) {
	for _, dir := range kustomizations(t) {
		t.Run(dir, func(t *testing.T) {
			b, err := kustomizeBuild(dir)
			if err != nil {
				t.Fatalf("kustomize build %s: %v", dir, err)
			}
			if len(b.objects) == 0 {
				t.Errorf("kustomize build %s: no objects", dir)
			}
		})
	}
}

// decodeStrict decodes an object into a Go type, refusing unknown and
// duplicate fields (the way a misspelt field would be silently dropped by the
// API server is exactly what this catches).
func decodeStrict(o *unstructured.Unstructured, into any) error {
	js, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	return yaml.UnmarshalStrict(js, into)
}

// fluxTypes maps the apiVersion/kind of every Flux object the layout may hold
// to a new value of its Go type.
var fluxTypes = map[string]func() any{
	"kustomize.toolkit.fluxcd.io/v1 Kustomization": func() any { return &kustomizev1.Kustomization{} },
	"helm.toolkit.fluxcd.io/v2 HelmRelease":        func() any { return &helmv2.HelmRelease{} },
	"source.toolkit.fluxcd.io/v1 OCIRepository":    func() any { return &sourcev1.OCIRepository{} },
	"source.toolkit.fluxcd.io/v1 HelmRepository":   func() any { return &sourcev1.HelmRepository{} },
	"source.toolkit.fluxcd.io/v1 GitRepository":    func() any { return &sourcev1.GitRepository{} },
}

// fluxObjects decodes every Flux object of every build into its API type.
type fluxObjects struct {
	kustomizations map[string]*kustomizev1.Kustomization // by dir/name
	helmReleases   map[string]*helmv2.HelmRelease
	ociRepos       map[string]*sourcev1.OCIRepository // by namespace/name
}

// TestFluxObjectsDecodeStrictly: every object of a toolkit.fluxcd.io group is
// of a known kind and version and decodes strictly into Flux's Go API type;
// references between them resolve.
func TestFluxObjectsDecodeStrictly(t *testing.T) {
	all := builds(t)
	seen := map[string]int{}
	for dir, b := range all {
		for _, o := range b.objects {
			if !strings.Contains(o.GetAPIVersion(), ".toolkit.fluxcd.io/") {
				continue
			}
			key := o.GetAPIVersion() + " " + o.GetKind()
			newObj, ok := fluxTypes[key]
			if !ok {
				t.Errorf("%s: %s %s is not a Flux API this layout targets", dir, key, o.GetName())
				continue
			}
			if err := decodeStrict(o, newObj()); err != nil {
				t.Errorf("%s: %s %s: %v", dir, key, o.GetName(), err)
			}
			seen[key]++
		}
	}
	for _, key := range []string{
		"kustomize.toolkit.fluxcd.io/v1 Kustomization",
		"helm.toolkit.fluxcd.io/v2 HelmRelease",
		"source.toolkit.fluxcd.io/v1 OCIRepository",
	} {
		if seen[key] < 2 {
			t.Errorf("%s: %d objects, want one per environment at least", key, seen[key])
		}
	}
}

// environments are the clusters/<env> directories.
func environments(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root(), "clusters"))
	if err != nil {
		t.Fatal(err)
	}
	var envs []string
	for _, e := range entries {
		if e.IsDir() {
			envs = append(envs, e.Name())
		}
	}
	if !slices.Contains(envs, "staging") || !slices.Contains(envs, "prod") {
		t.Fatalf("environments %v, want staging and prod", envs)
	}
	return envs
}

// environment is what Flux applies for one cluster, decoded.
type environment struct {
	name        string
	syncs       map[string]*kustomizev1.Kustomization // Flux Kustomizations by name
	release     *helmv2.HelmRelease
	repo        *sourcev1.OCIRepository
	configMaps  map[string]*unstructured.Unstructured // generated, by name
	secrets     []*unstructured.Unstructured          // from the secrets Kustomization
	namespaces  []*unstructured.Unstructured          // Namespaces of the secrets Kustomization
	secretsPath string
}

// loadEnvironment follows clusters/<env> the way Flux does: the root
// kustomization yields Flux Kustomizations, whose paths are built in turn.
func loadEnvironment(t *testing.T, env string) environment {
	t.Helper()
	e := environment{name: env, syncs: map[string]*kustomizev1.Kustomization{}, configMaps: map[string]*unstructured.Unstructured{}}
	top, err := kustomizeBuild(filepath.Join("clusters", env))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range top.find("kustomize.toolkit.fluxcd.io/v1", "Kustomization") {
		k := &kustomizev1.Kustomization{}
		if err := decodeStrict(o, k); err != nil {
			t.Fatal(err)
		}
		e.syncs[k.Name] = k
	}
	for name, k := range e.syncs {
		if k.Spec.SourceRef.Kind != "GitRepository" || k.Spec.SourceRef.Name != "flux-system" {
			t.Errorf("%s: Kustomization %s source %+v, want the bootstrap GitRepository flux-system", env, name, k.Spec.SourceRef)
		}
		for _, d := range k.Spec.DependsOn {
			if _, ok := e.syncs[d.Name]; !ok {
				t.Errorf("%s: Kustomization %s depends on unknown %s", env, name, d.Name)
			}
		}
		path := filepath.Clean(strings.TrimPrefix(k.Spec.Path, "./"))
		if !strings.HasPrefix(path, filepath.Join("clusters", env)) {
			t.Errorf("%s: Kustomization %s path %s leaves the environment", env, name, k.Spec.Path)
		}
		b, err := kustomizeBuild(path)
		if err != nil {
			t.Fatalf("%s: Kustomization %s path %s: %v", env, name, k.Spec.Path, err)
		}
		if k.Spec.Decryption != nil {
			e.secrets = append(e.secrets, b.find("v1", "Secret")...)
			e.namespaces = append(e.namespaces, b.find("v1", "Namespace")...)
			e.secretsPath = path
		}
		for _, o := range b.find("helm.toolkit.fluxcd.io/v2", "HelmRelease") {
			e.release = &helmv2.HelmRelease{}
			if err := decodeStrict(o, e.release); err != nil {
				t.Fatal(err)
			}
		}
		for _, o := range b.find("source.toolkit.fluxcd.io/v1", "OCIRepository") {
			e.repo = &sourcev1.OCIRepository{}
			if err := decodeStrict(o, e.repo); err != nil {
				t.Fatal(err)
			}
		}
		for _, o := range b.find("v1", "ConfigMap") {
			e.configMaps[o.GetName()] = o
		}
	}
	if e.release == nil || e.repo == nil {
		t.Fatalf("%s: no HelmRelease or OCIRepository reached through the Flux Kustomizations", env)
	}
	return e
}

// TestEnvironmentWiring: in each environment the HelmRelease takes its chart
// from the OCIRepository beside it and its values from generated ConfigMaps
// (hashed names, so a values change upgrades the release), installs into
// kube-system as the release docs/deploy belongs to, and the secrets are decrypted by Flux before the chart.
func TestEnvironmentWiring(t *testing.T) {
	for _, env := range environments(t) {
		t.Run(env, func(t *testing.T) {
			e := loadEnvironment(t, env)
			hr := e.release
			if hr.Spec.ChartRef == nil || hr.Spec.ChartRef.Kind != "OCIRepository" || hr.Spec.ChartRef.Name != e.repo.Name ||
				hr.Namespace != e.repo.Namespace {
				t.Errorf("chartRef %+v (HelmRelease in %s), OCIRepository %s/%s", hr.Spec.ChartRef, hr.Namespace, e.repo.Namespace, e.repo.Name)
			}
			if !strings.HasPrefix(e.repo.Spec.URL, "oci://") || e.repo.Spec.Reference == nil || e.repo.Spec.Reference.SemVer == "" {
				t.Errorf("OCIRepository %s: url %s ref %+v", e.repo.Name, e.repo.Spec.URL, e.repo.Spec.Reference)
			}
			// The release the static manifests' ownership metadata names, so
			// that Flux adopts a cluster bootstrapped with them (test/adopt).
			if hr.Spec.TargetNamespace != publish.StaticNamespace || hr.Spec.StorageNamespace != publish.StaticNamespace || hr.Spec.ReleaseName != publish.StaticRelease {
				t.Errorf("release %s into %s (stored in %s): docs/deploy is release %s in %s, which Flux would then not adopt",
					hr.Spec.ReleaseName, hr.Spec.TargetNamespace, hr.Spec.StorageNamespace, publish.StaticRelease, publish.StaticNamespace)
			}
			if hr.Spec.Install == nil || hr.Spec.Install.CRDs != helmv2.Create ||
				hr.Spec.Upgrade == nil || hr.Spec.Upgrade.CRDs != helmv2.CreateReplace {
				t.Error("the NativeCCM CRD must be created on install and updated on upgrade (install.crds/upgrade.crds)")
			}
			if len(hr.Spec.ValuesFrom) < 2 {
				t.Errorf("valuesFrom %+v: want the environment's values and at least one cloud", hr.Spec.ValuesFrom)
			}
			for _, ref := range hr.Spec.ValuesFrom {
				cm, ok := e.configMaps[ref.Name]
				if ref.Kind != "ConfigMap" || !ok {
					t.Errorf("valuesFrom %s/%s: no such generated ConfigMap (have %v)", ref.Kind, ref.Name, keys(e.configMaps))
					continue
				}
				if !regexp.MustCompile(`-[a-z0-9]{10}$`).MatchString(ref.Name) {
					t.Errorf("valuesFrom %s: not a content-hashed name", ref.Name)
				}
				if cm.GetNamespace() != hr.Namespace {
					t.Errorf("ConfigMap %s in %q, HelmRelease in %q", ref.Name, cm.GetNamespace(), hr.Namespace)
				}
				if data, _, _ := unstructured.NestedStringMap(cm.Object, "data"); data[ref.ValuesKey] == "" {
					t.Errorf("ConfigMap %s has no key %q", ref.Name, ref.ValuesKey)
				}
			}
			chart := e.syncs["hybrid-ccm"]
			secrets := e.syncs["hybrid-ccm-secrets"]
			if chart == nil || secrets == nil {
				t.Fatalf("Flux Kustomizations %v, want hybrid-ccm and hybrid-ccm-secrets", keys(e.syncs))
			}
			if secrets.Spec.Decryption == nil || secrets.Spec.Decryption.Provider != "sops" || secrets.Spec.Decryption.SecretRef == nil {
				t.Errorf("hybrid-ccm-secrets decryption %+v, want sops with a key Secret", secrets.Spec.Decryption)
			}
			if !slices.ContainsFunc(chart.Spec.DependsOn, func(d kustomizev1.DependencyReference) bool { return d.Name == secrets.Name }) {
				t.Error("hybrid-ccm does not wait for its credentials")
			}
			if !chart.Spec.Prune || chart.Spec.Timeout == nil {
				t.Errorf("hybrid-ccm prune %v timeout %v", chart.Spec.Prune, chart.Spec.Timeout)
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var encrypted = regexp.MustCompile(`^ENC\[AES256_GCM,data:[A-Za-z0-9+/=]+,iv:[A-Za-z0-9+/=]+,tag:[A-Za-z0-9+/=]+,type:(str|int|float|bool|bytes)\]$`)

// TestNoSecretInClear: every Secret anywhere under gitops/ (a file or a build
// output) is SOPS-encrypted: each value under data/stringData is an ENC[...]
// envelope and the sops stanza carries a MAC and the key it was encrypted for.
// ExternalSecrets hold references only.
func TestNoSecretInClear(t *testing.T) {
	var secrets []*unstructured.Unstructured
	for _, b := range builds(t) {
		secrets = append(secrets, b.find("v1", "Secret")...)
		for _, es := range b.find("external-secrets.io/v1", "ExternalSecret") {
			data, _, _ := unstructured.NestedSlice(es.Object, "spec", "data")
			for _, d := range data {
				if _, hasRef := d.(map[string]any)["remoteRef"]; !hasRef {
					t.Errorf("ExternalSecret %s: entry without remoteRef: %v", es.GetName(), d)
				}
			}
		}
	}
	// Files no kustomization lists are checked too.
	err := filepath.WalkDir(root(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, doc := range strings.Split(string(raw), "\n---") {
			var u unstructured.Unstructured
			if yaml.Unmarshal([]byte(doc), &u.Object) == nil && u.GetKind() == "Secret" {
				secrets = append(secrets, &u)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(secrets) == 0 {
		t.Fatal("no Secret found: the test is not looking at the layout")
	}
	for _, s := range secrets {
		name := s.GetNamespace() + "/" + s.GetName()
		mac, _, _ := unstructured.NestedString(s.Object, "sops", "mac")
		age, _, _ := unstructured.NestedSlice(s.Object, "sops", "age")
		if !encrypted.MatchString(mac) || len(age) == 0 {
			t.Errorf("Secret %s: no sops stanza with a MAC and an age recipient", name)
		}
		n := 0
		for _, field := range []string{"data", "stringData"} {
			values, _, _ := unstructured.NestedMap(s.Object, field)
			for k, v := range values {
				n++
				if str, _ := v.(string); !encrypted.MatchString(str) {
					t.Errorf("Secret %s: %s.%s is stored in clear", name, field, k)
				}
			}
		}
		if n == 0 {
			t.Errorf("Secret %s holds no values", name)
		}
	}
}
