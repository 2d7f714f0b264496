package profile

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/profiles"
)

// Error is a profile that failed to load or validate. It names the file, the
// profile and every offending field.
type Error struct {
	// File the profile (or override) came from.
	File string
	// Profile name, when known.
	Profile string
	// Err is a decoding error, or nil when Fields is set.
	Err error
	// Fields are validation errors with their field paths.
	Fields field.ErrorList
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Profile != "" {
		fmt.Fprintf(&b, ": profile %q", e.Profile)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	for i, f := range e.Fields {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(f.Error())
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Set is a validated collection of profiles, by name.
type Set struct {
	byName map[string]*Profile
	file   map[string]string
}

// Builtin loads the profiles embedded in the binary (profiles/*.yaml).
func Builtin() (*Set, error) {
	return LoadFS(profiles.FS, ".", "profiles")
}

// LoadFS loads every *.yaml file of dir in fsys. label prefixes file names in
// errors (e.g. "profiles").
func LoadFS(fsys fs.FS, dir, label string) (*Set, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read profiles from %s: %w", label, err)
	}
	s := &Set{byName: map[string]*Profile{}, file: map[string]string{}}
	for _, e := range entries {
		if e.IsDir() || !isYAML(e.Name()) {
			continue
		}
		data, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		file := path.Join(label, e.Name())
		p, err := Parse(file, data)
		if err != nil {
			return nil, err
		}
		if prev, ok := s.file[p.Name]; ok {
			return nil, &Error{File: file, Profile: p.Name, Err: fmt.Errorf("name already defined in %s", prev)}
		}
		s.byName[p.Name] = p
		s.file[p.Name] = file
	}
	if err := s.validateSet(); err != nil {
		return nil, err
	}
	return s, nil
}

func isYAML(name string) bool {
	return strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")
}

// Parse decodes one complete profile strictly and validates it.
func Parse(file string, data []byte) (*Profile, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, &Error{File: file, Err: err}
	}
	return decode(file, js)
}

func decode(file string, js []byte) (*Profile, error) {
	p := &Profile{}
	strictErrs, err := sigsjson.UnmarshalStrict(js, p)
	if err != nil {
		return nil, &Error{File: file, Err: err}
	}
	if len(strictErrs) > 0 {
		var fl field.ErrorList
		for _, e := range strictErrs {
			fl = append(fl, field.Invalid(nil, nil, e.Error()))
		}
		return nil, &Error{File: file, Profile: p.Name, Fields: fl}
	}
	if errs := Validate(p); len(errs) > 0 {
		return nil, &Error{File: file, Profile: p.Name, Fields: errs}
	}
	return p, nil
}

// Get returns a deep copy of the named profile.
func (s *Set) Get(name string) (*Profile, bool) {
	p, ok := s.byName[name]
	if !ok {
		return nil, false
	}
	return p.DeepCopy(), true
}

// File returns the file the named profile was last defined or overridden in.
func (s *Set) File(name string) string { return s.file[name] }

// Names returns the profile names, sorted.
func (s *Set) Names() []string {
	names := make([]string, 0, len(s.byName))
	for n := range s.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Override applies one override document: a partial profile whose name selects
// the profile to change (maps merge, lists and scalars replace, null removes), or
// a complete new profile. The result is validated as a whole.
func (s *Set) Override(file string, data []byte) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return &Error{File: file, Err: err}
	}
	var patch map[string]any
	if err := json.Unmarshal(js, &patch); err != nil {
		return &Error{File: file, Err: err}
	}
	name, _ := patch["name"].(string)
	if name == "" {
		return &Error{File: file, Fields: field.ErrorList{field.Required(field.NewPath("name"), "an override names the profile it changes or adds")}}
	}
	merged := patch
	if base, ok := s.byName[name]; ok {
		baseJS, err := json.Marshal(base)
		if err != nil {
			return err
		}
		var baseMap map[string]any
		if err := json.Unmarshal(baseJS, &baseMap); err != nil {
			return err
		}
		merged = MergeValues(baseMap, patch)
	}
	mergedJS, err := json.Marshal(merged)
	if err != nil {
		return err
	}
	p, err := decode(file, mergedJS)
	if err != nil {
		return err
	}
	next := &Set{byName: map[string]*Profile{}, file: map[string]string{}}
	for k, v := range s.byName {
		next.byName[k], next.file[k] = v, s.file[k]
	}
	next.byName[name], next.file[name] = p, file
	if err := next.validateSet(); err != nil {
		return err
	}
	s.byName, s.file = next.byName, next.file
	return nil
}

// OverrideDir applies every *.yaml file of a directory (sorted by name) as an
// override. A missing directory is an error; an empty one is not.
func (s *Set) OverrideDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read profile overrides: %w", err)
	}
	for _, e := range entries {
		// ConfigMap mounts carry ..data symlinks and dot-directories: skip them.
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || !isYAML(e.Name()) {
			continue
		}
		file := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		if err := s.Override(file, data); err != nil {
			return err
		}
	}
	return nil
}

// MergeValues merges src over dst: maps merge recursively, everything else
// (lists, scalars) replaces, and a null in src removes the key. dst is modified
// and returned.
func MergeValues(dst, src map[string]any) map[string]any {
	if dst == nil {
		dst = map[string]any{}
	}
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sm, sok := v.(map[string]any)
		dm, dok := dst[k].(map[string]any)
		if sok && dok {
			dst[k] = MergeValues(dm, sm)
			continue
		}
		dst[k] = v
	}
	return dst
}

func (s *Set) validateSet() error {
	ports := map[int32]string{}
	for _, name := range s.Names() {
		p := s.byName[name]
		if other, ok := ports[p.CCM.SecurePort]; ok {
			return &Error{File: s.file[name], Profile: name, Fields: field.ErrorList{
				field.Duplicate(field.NewPath("ccm", "securePort"), fmt.Sprintf("%d (also used by profile %q)", p.CCM.SecurePort, other)),
			}}
		}
		ports[p.CCM.SecurePort] = name
	}
	return nil
}

// reservedPorts are the well-known ports of kubelet and the control plane,
// including the default CCM ports every upstream CCM would otherwise share.
var reservedPorts = map[int32]string{
	10250: "kubelet", 10255: "kubelet read-only", 10256: "kube-proxy", 10257: "kube-controller-manager",
	10258: "default CCM secure port", 10259: "kube-scheduler", 10260: "default CCM webhook port",
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validateEnv checks plain variables: C identifiers, each once.
func validateEnv(fp *field.Path, env []EnvVar) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, e := range env {
		if !envNameRE.MatchString(e.Name) {
			errs = append(errs, field.Invalid(fp.Index(i).Child("name"), e.Name, "must be a C identifier"))
		}
		if seen[e.Name] {
			errs = append(errs, field.Duplicate(fp.Index(i).Child("name"), e.Name))
		}
		seen[e.Name] = true
	}
	return errs
}

// cloudConfigKeyRE is a cloud-config setting: an INI Section.key, or a key of
// a JSON or YAML file (lower or camel case, dashes, one level of nesting).
var cloudConfigKeyRE = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9]*\.)?[A-Za-z][A-Za-z0-9-]*$`)

// Validate checks one profile and returns every problem with its field path.
func Validate(p *Profile) field.ErrorList {
	var errs field.ErrorList
	if p.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), p.APIVersion, []string{APIVersion}))
	}
	if p.Kind != Kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), p.Kind, []string{Kind}))
	}
	errs = append(errs, dnsLabel(field.NewPath("name"), p.Name)...)

	platforms := field.NewPath("platforms")
	if len(p.Platforms) == 0 {
		errs = append(errs, field.Required(platforms, "at least one platform name routes nodes to this CCM"))
	}
	seen := map[string]bool{}
	for i, pl := range p.Platforms {
		errs = append(errs, dnsLabel(platforms.Index(i), pl)...)
		if seen[pl] {
			errs = append(errs, field.Duplicate(platforms.Index(i), pl))
		}
		seen[pl] = true
	}
	prefixes := field.NewPath("providerIDPrefixes")
	if len(p.ProviderIDPrefixes) == 0 {
		errs = append(errs, field.Required(prefixes, "the fence needs at least one providerID prefix"))
	}
	for i, pre := range p.ProviderIDPrefixes {
		if pre == "" || strings.ContainsAny(pre, " \t\n") {
			errs = append(errs, field.Invalid(prefixes.Index(i), pre, "must be non-empty and contain no whitespace"))
		}
	}

	errs = append(errs, validateCCM(field.NewPath("ccm"), &p.CCM)...)
	errs = append(errs, validateCredentials(field.NewPath("credentials"), p)...)
	errs = append(errs, validateChart(field.NewPath("chart"), &p.Chart)...)
	errs = append(errs, validateDomain(field.NewPath("domain"), p)...)

	if lb := p.LoadBalancers; lb != nil {
		fp := field.NewPath("loadBalancers")
		switch {
		case lb.Unsupported != "" && (lb.Controller != "" || len(lb.Env) > 0):
			errs = append(errs, field.Invalid(fp.Child("unsupported"), lb.Unsupported, "an unsupported CCM has no controller or env"))
		case lb.Unsupported == "" && !controllerNameRE.MatchString(lb.Controller):
			errs = append(errs, field.Invalid(fp.Child("controller"), lb.Controller, "the service controller's name in --controllers (lower-case letters, digits and -), e.g. service"))
		case lb.Controller == "cloud-node-lifecycle" || lb.Controller == "*":
			errs = append(errs, field.Invalid(fp.Child("controller"), lb.Controller, "must name the service controller only"))
		}
		errs = append(errs, validateEnv(fp.Child("env"), lb.Env)...)
		if len(lb.CloudConfig) > 0 && p.CCM.CloudConfig == nil {
			errs = append(errs, field.Invalid(fp.Child("cloudConfig"), lb.CloudConfig, "this CCM is given no cloud-config file (ccm.cloudConfig is not set)"))
		}
		keys := map[string]bool{}
		for i, k := range lb.CloudConfig {
			switch {
			case !cloudConfigKeyRE.MatchString(k):
				errs = append(errs, field.Invalid(fp.Child("cloudConfig").Index(i), k, "a setting of the cloud-config file, as Section.key or key"))
			case keys[k]:
				errs = append(errs, field.Duplicate(fp.Child("cloudConfig").Index(i), k))
			}
			keys[k] = true
		}
	}
	for i, o := range p.OptOutLabels {
		for _, msg := range validation.IsQualifiedName(o.Key) {
			errs = append(errs, field.Invalid(field.NewPath("optOutLabels").Index(i).Child("key"), o.Key, msg))
		}
	}
	for i, q := range p.Quirks {
		fp := field.NewPath("quirks").Index(i)
		if q.Name == "" {
			errs = append(errs, field.Required(fp.Child("name"), ""))
		}
		if q.Mitigation == "" {
			errs = append(errs, field.Required(fp.Child("mitigation"), "say how the profile deals with it"))
		}
	}
	return errs
}

func validateCCM(fp *field.Path, c *CCM) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateImage(fp.Child("image"), c.Image)...)
	errs = append(errs, validateNodeFilter(fp.Child("nodeFilter"), c)...)
	if c.CloudProvider == "" {
		errs = append(errs, field.Required(fp.Child("cloudProvider"), "the --cloud-provider value"))
	}
	errs = append(errs, ValidateArgs(fp.Child("args"), c.Args)...)
	if c.CloudConfig != nil {
		ccp := fp.Child("cloudConfig")
		if c.CloudConfig.Key == "" {
			errs = append(errs, field.Required(ccp.Child("key"), ""))
		}
		if !strings.HasPrefix(c.CloudConfig.Path, "/") {
			errs = append(errs, field.Invalid(ccp.Child("path"), c.CloudConfig.Path, "must be an absolute path"))
		}
		for i, a := range c.Args {
			if FlagName(a) == FlagName(c.CloudConfig.FlagName()) {
				errs = append(errs, field.Invalid(fp.Child("args").Index(i), a, "set by ccm.cloudConfig"))
			}
		}
	}
	errs = append(errs, validateEnv(fp.Child("env"), c.Env)...)
	audiences := map[string]bool{}
	for i, a := range c.TokenAudiences {
		ap := fp.Child("tokenAudiences").Index(i)
		switch {
		case a == "" || len(a) > 253 || strings.ContainsAny(a, " \t\r\n"):
			errs = append(errs, field.Invalid(ap, a, "an audience is a non-empty string of at most 253 characters without whitespace"))
		case apiServerAudience(a):
			errs = append(errs, field.Forbidden(ap, a+" is an audience of the API server: a token for it would let the CCM around the gate"))
		case audiences[a]:
			errs = append(errs, field.Duplicate(ap, a))
		}
		audiences[a] = true
	}
	port := fp.Child("securePort")
	switch {
	case c.SecurePort < 1024 || c.SecurePort > 65535:
		errs = append(errs, field.Invalid(port, c.SecurePort, "must be in 1024-65535"))
	case reservedPorts[c.SecurePort] != "":
		errs = append(errs, field.Invalid(port, c.SecurePort, "reserved for "+reservedPorts[c.SecurePort]))
	}
	return errs
}

// apiServerAudience reports the audiences API servers accept by default (the
// issuer a cluster's --service-account-issuer usually is): a profile cannot
// declare them. Another audience a cluster's API server is configured to
// accept is for its operator not to declare.
func apiServerAudience(a string) bool {
	host := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(a, "https://"), "http://"), "/")
	return host == "kubernetes" || host == "api" || host == "kubernetes.default" ||
		strings.HasPrefix(host, "kubernetes.default.svc")
}

// controllerNameRE is what a controller name in --controllers looks like.
var controllerNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// argRE is the one form an arg of a profile or an override may take: a flag
// with its value in the same argument. The name is what the CCM's flag parser
// accepts; the value is data (any text on one line).
var argRE = regexp.MustCompile(`^--[A-Za-z0-9][-A-Za-z0-9_.]*=[^\n\r]*$`)

// ValidateArgs refuses every arg that is not one --name=value argument, and
// every flag the coordinator enforces.
//
// The CCM's flag parser (pflag) reads a string flag without "=" as taking the
// next argument as its value: "--cluster-name" in front of
// "--controllers=cloud-node-lifecycle" sets cluster-name to that text and
// leaves --controllers at its default, every controller. Whether a flag is a
// boolean (which takes no separate value) only the CCM's own flag set knows,
// so a flag without "=" is refused whatever its kind: a boolean is written
// --name=true or --name=false. A value in an argument of its own, a
// single-dash flag (a pflag shorthand such as -v, which also takes the next
// argument) and the terminator "--" (after which no flag is read) are
// refused as well.
func ValidateArgs(fp *field.Path, args []string) field.ErrorList {
	var errs field.ErrorList
	for i, a := range args {
		name, _, hasValue := strings.Cut(a, "=")
		switch {
		case a == "--":
			errs = append(errs, field.Invalid(fp.Index(i), a, `"--" ends the CCM's flags: no flag after it would be read; remove it`))
			continue
		case !strings.HasPrefix(a, "-"):
			errs = append(errs, field.Invalid(fp.Index(i), a, "not a flag: every arg is one --name=value argument (a value never goes into an argument of its own)"))
			continue
		case !strings.HasPrefix(a, "--"):
			errs = append(errs, field.Invalid(fp.Index(i), a, "a single-dash flag (a shorthand like -v takes the next argument as its value): write it as --"+strings.TrimLeft(name, "-")+"=value"))
			continue
		case !hasValue:
			errs = append(errs, field.Invalid(fp.Index(i), a, "a flag without a value in the same argument: the CCM would take the next argument, which may be a flag the coordinator enforces such as --controllers, as its value; write "+a+"=value (a boolean flag as "+a+"=true)"))
			continue
		case !argRE.MatchString(a):
			errs = append(errs, field.Invalid(fp.Index(i), a, "must be --name=value: a name of letters, digits, '-', '_' and '.', a value on one line"))
			continue
		}
		if name := FlagName(a); slices.Contains(EnforcedFlags, name) {
			given, _, _ := strings.Cut(a, "=")
			msg := name + " is set by the coordinator"
			if given != name {
				msg = name + " (given as " + given + ") is set by the coordinator"
			}
			errs = append(errs, field.Forbidden(fp.Index(i), msg))
		}
	}
	return errs
}

// FlagName returns the flag an argument sets as the CCM's own flag parser
// reads it, in the form "--name": every CCM parses its command line with pflag
// and component-base's word-separator normalization, so "_" and "-" in a name
// are the same, and one or two leading dashes name a flag
// ("--use_service_account_credentials=true" sets
// --use-service-account-credentials). It returns "" for an argument that is
// not a flag (a value of the previous one in the "--flag value" form).
func FlagName(arg string) string {
	if !strings.HasPrefix(arg, "-") || arg == "-" || arg == "--" {
		return ""
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-"), "=")
	return "--" + strings.ReplaceAll(name, "_", "-")
}

func validateCredentials(fp *field.Path, p *Profile) field.ErrorList {
	var errs field.ErrorList
	c := p.Credentials
	if c.None {
		if c.SecretName != "" || len(c.Env) > 0 || c.EnvFrom || len(c.RequiredKeys) > 0 || p.CCM.CloudConfig != nil {
			errs = append(errs, field.Invalid(fp.Child("none"), true, "a CCM without credentials has no Secret, keys or cloud-config"))
		}
		return errs
	}
	for _, msg := range validation.IsDNS1123Subdomain(c.SecretName) {
		errs = append(errs, field.Invalid(fp.Child("secretName"), c.SecretName, msg))
	}
	if len(p.SecretKeys()) == 0 {
		errs = append(errs, field.Required(fp, "name the Secret keys the CCM needs (env, requiredKeys or ccm.cloudConfig), or set none"))
	}
	names := map[string]bool{}
	for _, e := range p.CCM.Env {
		names[e.Name] = true
	}
	for i, e := range c.Env {
		ep := fp.Child("env").Index(i)
		if !envNameRE.MatchString(e.Name) {
			errs = append(errs, field.Invalid(ep.Child("name"), e.Name, "must be a C identifier"))
		}
		if names[e.Name] {
			errs = append(errs, field.Duplicate(ep.Child("name"), e.Name))
		}
		names[e.Name] = true
		for _, msg := range validation.IsConfigMapKey(e.Key) {
			errs = append(errs, field.Invalid(ep.Child("key"), e.Key, msg))
		}
	}
	for i, k := range c.RequiredKeys {
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(fp.Child("requiredKeys").Index(i), k, msg))
		}
	}
	return errs
}

func validateChart(fp *field.Path, c *Chart) field.ErrorList {
	var errs field.ErrorList
	switch c.Source {
	case ChartBuiltin:
		if c.Repository != "" || c.Name != "" || c.Version != "" {
			errs = append(errs, field.Forbidden(fp, "the builtin chart takes no repository, name or version"))
		}
	case ChartRepository:
		u, err := url.Parse(c.Repository)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, field.Invalid(fp.Child("repository"), c.Repository, "must be an http(s) chart repository URL"))
		}
		if c.Name == "" {
			errs = append(errs, field.Required(fp.Child("name"), ""))
		}
		if c.Version == "" {
			errs = append(errs, field.Required(fp.Child("version"), "pin a chart version"))
		}
	case ChartOCI:
		if !strings.HasPrefix(c.Repository, "oci://") {
			errs = append(errs, field.Invalid(fp.Child("repository"), c.Repository, "must start with oci://"))
		}
		if c.Version == "" {
			errs = append(errs, field.Required(fp.Child("version"), "pin a chart version"))
		}
	default:
		errs = append(errs, field.NotSupported(fp.Child("source"), c.Source, []ChartSource{ChartBuiltin, ChartRepository, ChartOCI}))
	}
	if c.Source == ChartBuiltin && len(c.Values) > 0 {
		errs = append(errs, field.Forbidden(fp.Child("values"), "the builtin chart's values are derived from ccm and credentials"))
	}
	if w := c.Workload; w != nil {
		wp := fp.Child("workload")
		if w.Kind != "" && w.Kind != "Deployment" && w.Kind != "DaemonSet" {
			errs = append(errs, field.NotSupported(wp.Child("kind"), w.Kind, []string{"Deployment", "DaemonSet"}))
		}
		if _, err := regexp.Compile(w.Name); err != nil {
			errs = append(errs, field.Invalid(wp.Child("name"), w.Name, err.Error()))
		}
	}
	for i, d := range c.Drop {
		dp := fp.Child("drop").Index(i)
		if d.Kind == "" {
			errs = append(errs, field.Required(dp.Child("kind"), ""))
		}
		if _, err := regexp.Compile(d.Name); err != nil || d.Name == "" {
			errs = append(errs, field.Invalid(dp.Child("name"), d.Name, "must be a regular expression"))
		}
	}
	return errs
}

func dnsLabel(fp *field.Path, v string) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(v) {
		errs = append(errs, field.Invalid(fp, v, msg))
	}
	return errs
}

// DeepCopy returns an independent copy (through JSON: profiles are small).
func (p *Profile) DeepCopy() *Profile {
	js, err := json.Marshal(p)
	if err != nil {
		panic(err) // a Profile is always marshalable
	}
	out := &Profile{}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(js, out); err != nil {
		panic(err)
	}
	return out
}

// validateDomain checks the boundary label and the cloud-config setting
// that configures it.
func validateDomain(fp *field.Path, p *Profile) field.ErrorList {
	d := p.Domain
	if d == nil {
		return nil
	}
	var errs field.ErrorList
	if d.BoundaryLabel != "" {
		if msgs := validation.IsQualifiedName(d.BoundaryLabel); len(msgs) > 0 {
			errs = append(errs, field.Invalid(fp.Child("boundaryLabel"), d.BoundaryLabel, strings.Join(msgs, "; ")))
		}
	}
	if r := d.CloudConfigRegion; r != "" {
		fr := fp.Child("cloudConfigRegion")
		switch {
		case d.BoundaryLabel == "":
			errs = append(errs, field.Required(fp.Child("boundaryLabel"), "cloudConfigRegion configures the boundary label's value"))
		case !cloudConfigSectionKeyRE.MatchString(r):
			errs = append(errs, field.Invalid(fr, r, "a setting of the cloud-config file as Section.key"))
		case p.CCM.CloudConfig == nil:
			errs = append(errs, field.Required(field.NewPath("ccm", "cloudConfig"), "cloudConfigRegion is a setting of the cloud-config file"))
		case p.Chart.Source != ChartBuiltin:
			errs = append(errs, field.Invalid(fr, r, "only the builtin chart renders a split member's cloud config"))
		}
	}
	return errs
}

// cloudConfigSectionKeyRE is an INI Section.key without subsection.
var cloudConfigSectionKeyRE = regexp.MustCompile(`^[A-Za-z][-A-Za-z0-9]*\.[A-Za-z][-A-Za-z0-9]*$`)
