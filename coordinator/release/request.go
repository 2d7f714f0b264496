package release

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"strings"
	"sync"
	"text/template"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	nativeccm "github.com/hybrid-ccm/hybrid-ccm/charts/native-ccm"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// Request is one desired native CCM release: everything Install or Upgrade need.
type Request struct {
	// Name and Namespace of the Helm release.
	Name      string
	Namespace string
	// Chart says where the chart comes from.
	Chart profile.Chart
	// Values are the chart values.
	Values map[string]any
	// Lifecycle is the enforcement applied to every rendered manifest.
	Lifecycle Lifecycle
	// Mutators run after Lifecycle (the gate plugs in here).
	Mutators []Mutator
	// Upstream is the upstream CCM release the request runs (for the
	// NativeCCM's status; Lifecycle and Values carry its image and flags).
	Upstream profile.Upstream
}

// Instance is what a NativeCCM adds to a profile.
type Instance struct {
	// ReleaseName names the release, its lease, ServiceAccount and RBAC objects.
	ReleaseName string
	// Namespace of the release.
	Namespace string
	// Platform routed to the CCM.
	Platform string
	// SecretName of the credentials; empty: the profile's default.
	SecretName string
	// Image overrides (either part may be empty).
	ImageRepository, ImageTag string
	// KubernetesMinor is the API server's minor (N of 1.N): the profile's
	// upstream CCM release is chosen for it (profile.ChooseUpstream). 0: the
	// newest release the profile has.
	KubernetesMinor int
	// Args are appended to the profile's args.
	Args []string
	// Env replaces or extends the profile's env.
	Env []corev1.EnvVar
	// Values are merged over the chart values.
	Values map[string]any
	// LoadBalancers, when set, turns on the profile's service controller for
	// this class (Controller is taken from the profile).
	LoadBalancers *LoadBalancerSettings
	// ImagePullSecrets name Secrets in Namespace the CCM's pods pull their
	// images with (Lifecycle.ImagePullSecrets), in order, without repeats.
	ImagePullSecrets []string
	// CloudConfig, when set, is the cloud-config file the release writes
	// itself instead of mounting the credentials Secret's (the builtin
	// chart's cloudConfig.file): a split member's, with its region.
	CloudConfig *CloudConfigFile
}

// CloudConfigFile is a cloud-config file (INI) made of a base file and
// settings that override it.
type CloudConfigFile struct {
	// Base is the credentials Secret's file, as it is.
	Base string
	// Set are the settings written after it, each in a section of its own.
	Set []CloudConfigSetting
}

// CloudConfigSetting is one setting of an INI cloud-config file.
type CloudConfigSetting struct {
	Section, Name, Value string
}

// SettingOf makes a setting of a profile's Section.key (validated by the
// profile loader) and a value.
func SettingOf(sectionKey, value string) CloudConfigSetting {
	section, name, _ := strings.Cut(sectionKey, ".")
	return CloudConfigSetting{Section: section, Name: name, Value: value}
}

// ErrLoadBalancersUnsupported marks a NativeCCM that enables load balancers
// with a profile whose CCM cannot serve them.
var ErrLoadBalancersUnsupported = errors.New("load balancers unsupported")

// ValuesContext is what string values of an upstream chart mapping may use as
// Go templates, e.g. "{{ .SecretName }}".
type ValuesContext struct {
	ReleaseName, Namespace, Platform string
	SecretName                       string
	LeaseName                        string
	ServiceAccount                   string
	SecurePort                       int32
	Image                            profile.Image
	CloudProvider                    string
}

// FromProfile builds the release request of a NativeCCM. Errors are
// configuration errors (the NativeCCM or profile must change).
func FromProfile(p *profile.Profile, in Instance) (Request, error) {
	if errs := profile.ValidateArgs(field.NewPath("spec", "overrides", "args"), in.Args); len(errs) > 0 {
		return Request{}, errs.ToAggregate()
	}
	if errs := ValidateImagePullSecrets(field.NewPath("spec", "imagePullSecrets"), in.ImagePullSecrets); len(errs) > 0 {
		return Request{}, errs.ToAggregate()
	}
	if p.Chart.Source == profile.ChartBuiltin {
		// The builtin chart renders values.args into the CCM's args as they
		// are (an upstream chart's values mean what that chart says; the
		// post-renderer keeps its flags from swallowing the enforced ones).
		if errs := validateValuesArgs(field.NewPath("spec", "overrides", "values", "args"), in.Values); len(errs) > 0 {
			return Request{}, errs.ToAggregate()
		}
	}
	minor := in.KubernetesMinor
	if minor == 0 {
		minor = p.NewestMinor()
	}
	up, err := p.ChooseUpstream(minor, in.Platform, in.ImageRepository, in.ImageTag)
	if err != nil {
		return Request{}, err
	}
	image := profile.Image{Repository: up.Repository, Tag: up.Tag}
	secret := p.Credentials.SecretName
	if in.SecretName != "" {
		secret = in.SecretName
	}
	env := make([]corev1.EnvVar, 0, len(p.CCM.Env)+len(in.Env))
	for _, e := range p.CCM.Env {
		env = append(env, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	var lb *LoadBalancerSettings
	if in.LoadBalancers != nil {
		if ok, why := p.Supports(); !ok {
			return Request{}, fmt.Errorf("%w: spec.loadBalancers.enabled: %s", ErrLoadBalancersUnsupported, why)
		}
		lb = &LoadBalancerSettings{Controller: p.LoadBalancers.Controller, Class: in.LoadBalancers.Class, Default: in.LoadBalancers.Default}
		for _, e := range p.LoadBalancers.Env {
			env = setEnv(env, corev1.EnvVar{Name: e.Name, Value: e.Value})
		}
	}
	for _, e := range in.Env {
		env = setEnv(env, e)
	}
	if lb != nil && p.CCM.NodeFilter != nil && p.CCM.NodeFilter.FiltersServices {
		// its service controller would see only Services with the platform label
		up.NodeFilterArgs = nil
	}
	args := append(append(append([]string{}, p.CCM.Args...), up.NodeFilterArgs...), in.Args...)

	lc := Lifecycle{
		Release:       in.ReleaseName,
		Namespace:     in.Namespace,
		Platform:      in.Platform,
		LeaseName:     in.ReleaseName,
		SecurePort:    p.CCM.SecurePort,
		Image:         up.Reference(),
		Args:          args,
		Env:           env,
		Workload:      p.Chart.Workload,
		Drop:          p.Chart.Drop,
		HostNetwork:   p.CCM.HostNetwork,
		LoadBalancers: lb,
		// a copy: the request must not share the profile's list
		TokenAudiences:   append([]string(nil), p.CCM.TokenAudiences...),
		ImagePullSecrets: append([]string(nil), in.ImagePullSecrets...),
	}
	req := Request{Name: in.ReleaseName, Namespace: in.Namespace, Chart: p.Chart, Lifecycle: lc, Upstream: up}

	var values map[string]any
	if in.CloudConfig != nil && (p.Chart.Source != profile.ChartBuiltin || p.CCM.CloudConfig == nil) {
		return Request{}, fmt.Errorf("profile %s: a cloud-config file of the release's own needs the builtin chart and ccm.cloudConfig", p.Name)
	}
	if p.Chart.Source == profile.ChartBuiltin {
		values = builtinValues(p, in, image, secret, args, env)
	} else {
		ctx := ValuesContext{
			ReleaseName: in.ReleaseName, Namespace: in.Namespace, Platform: in.Platform,
			SecretName: secret, LeaseName: lc.LeaseName, ServiceAccount: lc.ServiceAccountName(),
			SecurePort: p.CCM.SecurePort, Image: image, CloudProvider: p.CCM.CloudProvider,
		}
		v, err := renderValues(p.Chart.Values, ctx)
		if err != nil {
			return Request{}, fmt.Errorf("profile %s: chart.values: %w", p.Name, err)
		}
		values = v.(map[string]any)
	}
	if in.Values != nil {
		values = profile.MergeValues(values, deepCopyValues(in.Values))
	}
	req.Values = values
	return req, nil
}

// ValidateImagePullSecrets checks the names of image pull Secrets: each a
// Secret name (a DNS subdomain), none twice.
func ValidateImagePullSecrets(fp *field.Path, names []string) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, n := range names {
		for _, msg := range validation.IsDNS1123Subdomain(n) {
			errs = append(errs, field.Invalid(fp.Index(i), n, "not a Secret name: "+msg))
		}
		if seen[n] {
			errs = append(errs, field.Duplicate(fp.Index(i), n))
		}
		seen[n] = true
	}
	return errs
}

// validateValuesArgs checks the args a NativeCCM's values give the builtin
// chart like spec.overrides.args.
func validateValuesArgs(fp *field.Path, values map[string]any) field.ErrorList {
	raw, ok := values["args"]
	if !ok || raw == nil {
		return nil
	}
	list, ok := raw.([]any)
	if !ok {
		return field.ErrorList{field.Invalid(fp, raw, "must be a list of --name=value strings")}
	}
	args := make([]string, len(list))
	for i, a := range list {
		s, ok := a.(string)
		if !ok {
			return field.ErrorList{field.Invalid(fp.Index(i), a, "must be a --name=value string")}
		}
		args[i] = s
	}
	return profile.ValidateArgs(fp, args)
}

func builtinValues(p *profile.Profile, in Instance, image profile.Image, secret string, args []string, env []corev1.EnvVar) map[string]any {
	envList := make([]any, 0, len(env))
	for _, e := range env {
		envList = append(envList, toMap(e))
	}
	argList := make([]any, len(args))
	for i, a := range args {
		argList[i] = a
	}
	creds := map[string]any{"secretName": "", "env": []any{}, "envFrom": false}
	if p.NeedsSecret() {
		credEnv := make([]any, 0, len(p.Credentials.Env))
		for _, e := range p.Credentials.Env {
			credEnv = append(credEnv, map[string]any{"name": e.Name, "key": e.Key, "optional": e.Optional})
		}
		creds = map[string]any{"secretName": secret, "env": credEnv, "envFrom": p.Credentials.EnvFrom}
	}
	cloudConfig := map[string]any{"key": "", "path": "", "flag": "--cloud-config"}
	if cc := p.CCM.CloudConfig; cc != nil {
		cloudConfig = map[string]any{"key": cc.Key, "path": cc.Path, "flag": cc.FlagName()}
		if f := in.CloudConfig; f != nil {
			set := make([]any, 0, len(f.Set))
			for _, s := range f.Set {
				set = append(set, map[string]any{"section": s.Section, "name": s.Name, "value": s.Value})
			}
			cloudConfig["file"] = map[string]any{"base": f.Base, "set": set}
		}
	}
	return map[string]any{
		"platform":       in.Platform,
		"image":          map[string]any{"repository": image.Repository, "tag": image.Tag},
		"cloudProvider":  p.CCM.CloudProvider,
		"args":           argList,
		"env":            envList,
		"credentials":    creds,
		"cloudConfig":    cloudConfig,
		"securePort":     int64(p.CCM.SecurePort),
		"hostNetwork":    p.CCM.HostNetwork,
		"leaderElection": map[string]any{"resourceName": in.ReleaseName, "resourceNamespace": in.Namespace},
		// Identity and RBAC come from the post-renderer, for every chart alike.
		"serviceAccount": map[string]any{"create": false, "name": in.ReleaseName},
		"rbac":           map[string]any{"create": false},
	}
}

func toMap(v any) map[string]any {
	b, _ := json.Marshal(v)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

func deepCopyValues(v map[string]any) map[string]any {
	b, err := json.Marshal(v)
	if err != nil {
		return maps.Clone(v)
	}
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// renderValues executes every string in v as a template over ctx.
func renderValues(v any, ctx ValuesContext) (any, error) {
	switch x := v.(type) {
	case nil:
		return map[string]any{}, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			r, err := renderValues(e, ctx)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			r, err := renderValues(e, ctx)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = r
		}
		return out, nil
	case string:
		t, err := template.New("value").Option("missingkey=error").Parse(x)
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		if err := t.Execute(&b, ctx); err != nil {
			return nil, err
		}
		return b.String(), nil
	default:
		return x, nil
	}
}

// Digest identifies the desired state of a request: chart reference, values,
// and every mutator's fingerprint. A deployed release with the same digest is
// up to date. It is a valid label value (stored on the release).
func (r Request) Digest() string {
	type mut struct{ Name, Fingerprint string }
	var muts []mut
	for _, m := range r.mutators() {
		muts = append(muts, mut{m.Name(), m.Fingerprint()})
	}
	chartRef := struct {
		Source                    profile.ChartSource
		Repository, Name, Version string
		Builtin                   string
	}{r.Chart.Source, r.Chart.Repository, r.Chart.Name, r.Chart.Version, ""}
	if r.Chart.Source == profile.ChartBuiltin {
		chartRef.Builtin = builtinChartDigest()
	}
	b, _ := json.Marshal(struct {
		Chart    any
		Values   map[string]any
		Mutators []mut
	}{chartRef, r.Values, muts})
	return fmt.Sprintf("%x", sha256.Sum256(b))[:40]
}

// builtinChartDigest identifies the embedded chart's content (charts/native-ccm).
var builtinChartDigest = sync.OnceValue(func() string {
	h := sha256.New()
	// An unreadable embedded chart fails to load in the engine, which says why.
	_ = fs.WalkDir(nativeccm.Files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(nativeccm.Files, p)
		if err != nil {
			return err
		}
		h.Write([]byte(p))
		h.Write(data)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:16]
})
