package gate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const (
	// DefaultFenceName names the fence's ValidatingAdmissionPolicy and its
	// binding, as the ccm-coordinator chart ships them.
	DefaultFenceName = "native-ccm-fence.hybridccm.io"
	// DigestAnnotation records the digest of the fence's logic on its objects
	// (the same for every namespace), so that the coordinator can tell a fence
	// of another version from its own.
	DigestAnnotation = "hybridccm.io/fence-digest"
	// FieldOwner is the field manager of the fence objects when EnsureFence
	// writes them (tests and the demo; in a cluster the chart does).
	FieldOwner = "ccm-coordinator"
)

// Fence is the one admission policy that confines every native CCM of a
// coordinator. The ccm-coordinator chart ships it (templates/fence.yaml,
// generated from this type by `make generate`), so the coordinator needs no
// right to write admission policies: it cannot delete or loosen a fence.
//
// The policy has no parameters (no paramKind): nothing it needs can be
// missing or unsynced in the API server, so it never refuses a request of an
// identity it does not confine. Its matchConditions select the ServiceAccounts
// system:serviceaccount:<Namespace>:native-ccm-<name> and nothing else; for
// those it allows what cloud-node-lifecycle (and the service controller) need,
// on nodes labelled with a platform the ServiceAccount's grant names (Grant,
// checked with the API server's authorizer) whose providerID starts with one
// of that platform's prefixes (ProviderIDPrefixes, in the policy itself), and
// denies everything else with a message naming the NativeCCM, the object and
// the field. A ServiceAccount without its grant (no NativeCCM) may change
// nothing.
type Fence struct {
	// Name of the policy and binding; default DefaultFenceName.
	Name string
	// Namespace is the coordinator's release namespace, where the native CCMs'
	// ServiceAccounts live.
	Namespace string
	// ProviderIDPrefixes maps each platform to the providerID prefixes of its
	// nodes: a native CCM granted a platform may change only nodes whose
	// providerID starts with one of them. Nil: those of the built-in profiles
	// (BuiltinPrefixes). The chart renders the built-in profiles merged with
	// its profileOverrides, as the coordinator loads them (PrefixTable).
	ProviderIDPrefixes map[string][]string
	// DomainKeys are the node label keys a NativeCCM's domain may restrict
	// (at most 4). Nil: BuiltinDomainKeys. The chart renders those and its
	// fence.domainLabels.
	DomainKeys []string
	// Ingress is what native CCMs may announce as load-balancer ingress IPs
	// (services.go).
	Ingress Ingress
}

// ErrConfig marks errors that only a change of the NativeCCM, its profile or
// the installation can fix. Other errors from this package are API errors
// worth retrying.
var ErrConfig = errors.New("invalid gate configuration")

// ErrFenceNotInstalled means the fence policy or binding is absent or not the
// one this coordinator expects: the ccm-coordinator chart of the same version
// installs it. Nothing is installed until it is there.
var ErrFenceNotInstalled = errors.New("fence not installed")

func (f Fence) name() string {
	if f.Name == "" {
		return DefaultFenceName
	}
	return f.Name
}

// Username is the user name the fence confines for a NativeCCM.
func (f Fence) Username(nativeCCM string) string {
	return "system:serviceaccount:" + f.Namespace + ":" + v1.ReleasePrefix + nativeCCM
}

// Validate reports fields that would make the fence meaningless or open.
func (f Fence) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(f.name()); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("name %q: %s", f.name(), strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Label(f.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("namespace %q: %s", f.Namespace, strings.Join(msgs, "; ")))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: fence: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

// ValidatePrefixes reports providerID prefixes the fence would not accept as
// proof of ownership: an empty or very short prefix ("h", "aws") would match
// other clouds' IDs.
func ValidatePrefixes(prefixes []string) error {
	var errs []error
	if len(prefixes) == 0 {
		errs = append(errs, errors.New("providerIDPrefixes: at least one is required"))
	}
	if len(prefixes) > maxPrefixes {
		errs = append(errs, fmt.Errorf("providerIDPrefixes: %d, at most %d", len(prefixes), maxPrefixes))
	}
	for i, p := range prefixes {
		if len(p) < minPrefix || len(p) > 64 || strings.ContainsAny(p, " \t\r\n") {
			errs = append(errs, fmt.Errorf("providerIDPrefixes[%d] %q: must be %d to 64 characters without spaces (e.g. hcloud://)", i, p, minPrefix))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

// Limits of status.gate.providerIDPrefixes (the CRD says the same).
const (
	maxPrefixes = 8
	minPrefix   = 4
)

// Objects renders the ValidatingAdmissionPolicy and its binding.
//
// The policy matches CREATE, UPDATE (which includes PATCH) and DELETE of
// nodes, nodes/status, services and services/status, only for requests by
// native CCM ServiceAccounts of the namespace (matchConditions), with
// failurePolicy Fail so that an evaluation error denies. It has no paramKind
// and its binding no paramRef. It holds the facts verified on real API
// servers: object is null on DELETE and every object read is guarded; absent
// labels, providerIDs and status fields are read with CEL optionals.
func (f Fence) Objects() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	if err := f.Validate(); err != nil {
		return nil, nil, err
	}
	table := f.ProviderIDPrefixes
	if table == nil {
		var err error
		if table, err = BuiltinPrefixes(); err != nil {
			return nil, nil, err
		}
	}
	lit, err := prefixLiteral(table)
	if err != nil {
		return nil, nil, err
	}
	keys := f.DomainKeys
	if keys == nil {
		keys = BuiltinDomainKeys
	}
	keyLit, err := DomainKeyLiteral(keys)
	if err != nil {
		return nil, nil, err
	}
	p, b := f.render(f.Namespace, lit, keyLit)
	if err := fillIngress(p, f.Ingress); err != nil {
		return nil, nil, err
	}
	d := FenceDigest()
	p.Annotations = map[string]string{DigestAnnotation: d}
	b.Annotations = map[string]string{DigestAnnotation: d}
	return p, b, nil
}

// Placeholders of FenceDigest and FenceTemplate: the namespace, and the
// providerID prefixes of every platform, which the chart fills in.
const (
	digestNamespace = "@NAMESPACE@"
	digestPrefixes  = "@PROVIDER_ID_PREFIXES@"
)

// prefixesVariable names the policy's variable that holds the providerID
// prefixes of every platform, a CEL map literal written as JSON.
const prefixesVariable = "providerIDPrefixes"

// FenceDigest identifies the fence's logic, whatever the name, namespace and
// providerID prefixes.
func FenceDigest() string {
	p, b := Fence{Name: DefaultFenceName}.render(digestNamespace, digestPrefixes, digestDomainKeys)
	buf, _ := json.Marshal([]any{p.Spec, b.Spec})
	return fmt.Sprintf("%x", sha256.Sum256(buf))[:16]
}

// prefixLiteral writes a prefix table as the policy holds it: JSON (which is
// CEL: a map of string lists), keys sorted, every list sorted and without
// duplicates, as Helm's toJson writes the chart's table.
func prefixLiteral(table map[string][]string) (string, error) {
	norm := make(map[string][]string, len(table))
	for platform, prefixes := range table {
		if msgs := validation.IsDNS1123Label(platform); len(msgs) > 0 {
			return "", fmt.Errorf("%w: providerID prefixes of platform %q: %s", ErrConfig, platform, strings.Join(msgs, "; "))
		}
		norm[platform] = sortedUnique(prefixes)
	}
	buf, err := json.Marshal(norm)
	return string(buf), err
}

func sortedUnique(in []string) []string {
	out := append([]string{}, in...)
	slices.Sort(out)
	return slices.Compact(out)
}

// PrefixTable is the providerID prefixes of every platform that one of the
// profiles routes: the union of the prefixes of the profiles that route it.
func PrefixTable(profiles ...*profile.Profile) map[string][]string {
	table := map[string][]string{}
	for _, p := range profiles {
		for _, platform := range p.Platforms {
			table[platform] = sortedUnique(append(table[platform], p.ProviderIDPrefixes...))
		}
	}
	return table
}

// SetPrefixTable is PrefixTable of every profile of a set.
func SetPrefixTable(set *profile.Set) map[string][]string {
	var all []*profile.Profile
	for _, n := range set.Names() {
		p, _ := set.Get(n)
		all = append(all, p)
	}
	return PrefixTable(all...)
}

// BuiltinPrefixes is the prefix table of the built-in profiles.
func BuiltinPrefixes() (map[string][]string, error) {
	set, err := profile.Builtin()
	if err != nil {
		return nil, err
	}
	return SetPrefixTable(set), nil
}

// who names the requester in denials.
const who = "variables.who"

func (f Fence) render(namespace, prefixes, domainKeys string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	name := f.name()
	label := celString(names.PlatformLabel)
	saPrefix := "system:serviceaccount:" + namespace + ":" + v1.ReleasePrefix
	verb := `(request.operation == 'DELETE' ? 'delete' : request.operation == 'CREATE' ? 'create' : (request.?subResource.orValue('') == '' ? 'change' : 'change the ' + request.subResource + ' of'))`
	kind := `(variables.isService ? 'Service ' + request.namespace + '/' + request.name : 'node ' + request.name)`
	grant := lit(GrantPrefix) + " + variables.nativeCCM"
	// node applies a validation to nodes only.
	node := func(expr string) string { return "variables.isService || (" + expr + ")" }

	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: meta(name),
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{},
				ObjectSelector:    &metav1.LabelSelector{},
				MatchPolicy:       ptr.To(admissionregistrationv1.Equivalent),
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
						Rule: admissionregistrationv1.Rule{
							APIGroups:   []string{""},
							APIVersions: []string{"*"},
							// nodes/status too: status patches are a separate
							// resource; Services for load balancers.
							Resources: []string{"nodes", "nodes/status", "services", "services/status"},
							Scope:     ptr.To(admissionregistrationv1.AllScopes),
						},
					},
				}},
			},
			// The only identities the fence evaluates. Every other request
			// (kubelets, talos-ccm, admins) skips it here.
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "native-ccm-identity",
				Expression: "request.userInfo.username.startsWith(" + celString(saPrefix) + ")",
			}},
			Variables: append(append(append([]admissionregistrationv1.Variable{
				// The NativeCCM (or split member) whose ServiceAccount sends the request.
				{Name: "nativeCCM", Expression: "request.userInfo.username.substring(size(" + celString(saPrefix) + "))"},
				{Name: "isService", Expression: "request.resource.resource == 'services'"},
				{Name: "who", Expression: "'NativeCCM ' + variables.nativeCCM + ' (' + request.userInfo.username + ')'"},
			}, domainVariables(namespace, domainKeys)...), append([]admissionregistrationv1.Variable{
				// Its grant (RBAC, asked of the authorizer about the NativeCCM's ServiceAccount).
				{Name: "granted", Expression: grantCheck(grantNativeCCMs, "variables.parent")},
				{Name: "wildcard", Expression: grantCheck(grantPlatforms, lit(wildcardProbe)) + " || " + grantCheck(grantClasses, lit(wildcardProbe))},
				{Name: "wildcardDomain", Expression: grantCheck(grantDomains, lit(wildcardProbe)) + " || " + grantCheck(grantSplits, lit(wildcardProbe))},
				{Name: "oldPlatform", Expression: "request.operation == 'CREATE' ? '' : oldObject.metadata.?labels[?" + label + "].orValue('')"},
				{Name: "oldProviderID", Expression: "request.operation == 'CREATE' ? '' : oldObject.?spec.?providerID.orValue('')"},
				{Name: "newPlatform", Expression: "request.operation == 'UPDATE' ? object.metadata.?labels[?" + label + "].orValue('') : ''"},
				{Name: "newProviderID", Expression: "request.operation == 'UPDATE' ? object.?spec.?providerID.orValue('') : ''"},
				{Name: "ownPlatform", Expression: "variables.oldPlatform != '' && " + grantCheck(grantPlatforms, "variables.oldPlatform")},
				{Name: prefixesVariable, Expression: prefixes},
				{Name: "prefixes", Expression: "variables." + prefixesVariable + "[?variables.oldPlatform].orValue([]).filter(p, size(p) >= " + strconv.Itoa(minPrefix) + ")"},
				{Name: "ownProviderID", Expression: "variables.oldProviderID != '' && variables.prefixes.exists(p, variables.oldProviderID.startsWith(p))"},
			}, changeVariables()...)...), serviceVariables()...),
			Validations: append(append(append([]admissionregistrationv1.Validation{
				{
					Expression: "variables.granted",
					Message:    "hybrid-ccm gate: a native CCM ServiceAccount without its grant (no NativeCCM) may change nothing",
					MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not "), verb, lit(" "), kind,
						lit(": its ServiceAccount holds no fence grant for NativeCCM "), "variables.nativeCCM",
						lit(" (ClusterRoleBinding "), grant, lit(", made with the NativeCCM): a native CCM identity without its NativeCCM may change nothing")),
					Reason: ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: "!variables.wildcard && !variables.wildcardDomain",
					Message:    "hybrid-ccm gate: a native CCM ServiceAccount that RBAC grants every platform or load balancer class (a wildcard) may change nothing",
					MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not "), verb, lit(" "), kind,
						lit(": RBAC grants it "+GrantGroup+" for any name (a rule without resourceNames, or a wildcard such as cluster-admin's), so the fence cannot tell its platform: bind it only to its grant "), grant),
					Reason: ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression:        node("request.operation != 'CREATE'"),
					Message:           "hybrid-ccm gate: a native CCM may not create nodes",
					MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not create nodes")),
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: node("variables.ownPlatform"),
					Message:    "hybrid-ccm gate: a native CCM may only change nodes labelled with its platform (" + names.PlatformLabel + ")",
					MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not "), verb, lit(" node "), "request.name",
						lit(": its label "+names.PlatformLabel+" is "),
						"(variables.oldPlatform == '' ? 'missing' : '\"' + variables.oldPlatform + '\", a platform its grant "+GrantPrefix+"' + variables.nativeCCM + ' does not name')"),
					Reason: ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: node("size(variables.prefixes) > 0"),
					Message:    "hybrid-ccm gate: the fence knows no providerID prefixes of this platform, so a native CCM may change none of its nodes",
					MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not "), verb, lit(" node "), "request.name",
						lit(": the fence knows no providerID prefixes of platform "), "variables.oldPlatform",
						lit(" (the ccm-coordinator chart renders them from its profiles and profileOverrides)")),
					Reason: ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: node("variables.ownProviderID"),
					Message:    "hybrid-ccm gate: a native CCM may only change nodes whose providerID starts with one of its platform's prefixes",
					MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not "), verb, lit(" node "), "request.name", lit(": "),
						"(variables.oldProviderID == '' ? "+lit("it has no providerID (an empty providerID is never proof)")+
							" : "+cel(lit("its providerID \""), "variables.oldProviderID", lit("\" does not start with "), "variables.prefixes.join(' or ')")+")"),
					Reason: ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression:        node("request.operation != 'UPDATE' || variables.newPlatform == variables.oldPlatform"),
					Message:           "hybrid-ccm gate: a native CCM may not change the label " + names.PlatformLabel,
					MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not change the label "+names.PlatformLabel+" of node "), "request.name"),
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression:        node("request.operation != 'UPDATE' || variables.newProviderID == variables.oldProviderID"),
					Message:           "hybrid-ccm gate: a native CCM may not set or change a providerID",
					MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not set or change the providerID of node "), "request.name"),
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
			}, changeValidations(node, who)...), serviceValidations(who)...), domainValidations(node, who)...),
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: meta(name),
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	return policy, binding
}

// grantCheck is a CEL expression: does the grant of the requester's
// NativeCCM (RBAC, asked of the API server's authorizer about the
// NativeCCM's ServiceAccount, which is the requester unless it is a split
// member) let it "fence" resource name of GrantGroup? name is a CEL string
// expression; empty: no name.
func grantCheck(resource, name string) string {
	expr := "authorizer.serviceAccount(variables.grantNamespace, variables.grantee).group(" + lit(GrantGroup) + ").resource(" + lit(resource) + ")"
	if name != "" {
		expr += ".name(" + name + ")"
	}
	return expr + ".check(" + lit(GrantVerb) + ").allowed()"
}

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{release.ManagedByLabel: "ccm-coordinator-chart"},
	}
}

// celString quotes s as a CEL string literal (Go's double-quoted escapes are a
// subset of CEL's). Every value that does not come from the request enters an
// expression only through it.
func celString(s string) string { return strconv.Quote(s) }

// lit is celString, short for message expressions.
func lit(s string) string { return celString(s) }

// cel concatenates CEL string expressions.
func cel(parts ...string) string { return "(" + strings.Join(parts, " + ") + ")" }

// FenceTemplate is the ccm-coordinator chart's templates/fence.yaml: the
// policy and binding of Fence{} with the release namespace and the providerID
// prefixes filled in by Helm: those of the built-in profiles (written into the
// template here) merged with the chart's profileOverrides as the coordinator's
// profile loader merges them (a name selects the profile to change, lists
// replace). A test checks that the file is this and that the chart renders
// what Objects renders for the same namespace and profiles.
func FenceTemplate() ([]byte, error) {
	p, b := Fence{}.render(digestNamespace, digestPrefixes, digestDomainKeys)
	set, err := profile.Builtin()
	if err != nil {
		return nil, err
	}
	builtin := map[string]map[string][]string{}
	for _, n := range set.Names() {
		pr, _ := set.Get(n)
		builtin[n] = map[string][]string{"platforms": pr.Platforms, "providerIDPrefixes": pr.ProviderIDPrefixes}
	}
	builtinJSON, err := json.Marshal(builtin)
	if err != nil {
		return nil, err
	}
	if bytes.ContainsAny(builtinJSON, "`") {
		return nil, errors.New("gate.FenceTemplate: a built-in profile contains a backquote")
	}
	var out bytes.Buffer
	out.WriteString("{{- /* Generated by `make generate` from coordinator/gate/fence.go (gate.FenceTemplate). Do not edit. */ -}}\n")
	out.WriteString("{{- $ns := include \"ccm-coordinator.releaseNamespace\" . }}\n")
	// The profiles as the coordinator loads them: built-in, then each
	// override in file-name order (Helm ranges over a map in key order).
	fmt.Fprintf(&out, "{{- $profiles := `%s` | fromJson }}\n", builtinJSON)
	out.WriteString(`{{- range $file, $o := .Values.profileOverrides }}
{{- $base := get $profiles $o.name | default dict }}
{{- $platforms := hasKey $o "platforms" | ternary $o.platforms $base.platforms }}
{{- $prefixes := hasKey $o "providerIDPrefixes" | ternary $o.providerIDPrefixes $base.providerIDPrefixes }}
{{- $_ := set $profiles $o.name (dict "platforms" ($platforms | default list) "providerIDPrefixes" ($prefixes | default list)) }}
{{- end }}
{{- $table := dict }}
{{- range $name, $p := $profiles }}
{{- range $platform := $p.platforms }}
{{- $_ := set $table $platform (concat (get $table $platform | default list) $p.providerIDPrefixes | uniq | sortAlpha) }}
{{- end }}
{{- end }}
`)
	// The domain label keys: the built-in ones and gate.domainLabels.
	builtinKeys, err := json.Marshal(BuiltinDomainKeys)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(&out, "{{- $domainKeys := concat (`%s` | fromJsonArray) (.Values.gate.domainLabels | default list) | uniq | sortAlpha }}\n", builtinKeys)
	fmt.Fprintf(&out, "{{- if gt (len $domainKeys) %d }}{{ fail (printf \"gate.domainLabels: the fence checks at most %d domain labels, and with the built-in ones these are %%d: %%s\" (len $domainKeys) (join \", \" $domainKeys)) }}{{ end }}\n", domainSlots, domainSlots)
	out.WriteString("# The fence: what every native CCM of this coordinator may change on nodes\n")
	out.WriteString("# and Services (docs/gate.md). No paramKind: it never refuses anyone but a\n")
	out.WriteString("# native CCM. The coordinator only reads it; see docs/security.md.\n")
	for i, o := range []struct {
		kind string
		spec any
	}{{"ValidatingAdmissionPolicy", p.Spec}, {"ValidatingAdmissionPolicyBinding", b.Spec}} {
		spec, err := yaml.Marshal(o.spec)
		if err != nil {
			return nil, err
		}
		if bytes.Contains(spec, []byte("{{")) || bytes.Contains(spec, []byte("}}")) {
			return nil, errors.New("gate.FenceTemplate: the fence contains template delimiters")
		}
		spec = bytes.ReplaceAll(spec, []byte(digestNamespace), []byte("{{ $ns }}"))
		// The prefix table is the whole expression of its variable, a JSON
		// string (which is a YAML double-quoted scalar) of the JSON table.
		quoted := []byte("expression: '" + digestPrefixes + "'")
		if i == 0 && !bytes.Contains(spec, quoted) {
			return nil, errors.New("gate.FenceTemplate: the prefix table's placeholder is not a plain expression")
		}
		spec = bytes.ReplaceAll(spec, quoted, []byte("expression: {{ $table | toJson | toJson }}"))
		quotedKeys := []byte("expression: '" + digestDomainKeys + "'")
		if i == 0 && !bytes.Contains(spec, quotedKeys) {
			return nil, errors.New("gate.FenceTemplate: the domain keys' placeholder is not a plain expression")
		}
		spec = bytes.ReplaceAll(spec, quotedKeys, []byte("expression: {{ $domainKeys | toJson | toJson }}"))
		if i == 0 {
			if spec, err = ingressTemplate(spec); err != nil {
				return nil, err
			}
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		fmt.Fprintf(&out, "apiVersion: %s\nkind: %s\nmetadata:\n  name: %s\n  labels:\n    {{- include \"ccm-coordinator.labels\" . | nindent 4 }}\n  annotations:\n    {{- include \"ccm-coordinator.ownership\" . | nindent 4 }}\n    %s: %q\nspec:\n",
			admissionregistrationv1.SchemeGroupVersion.String(), o.kind, DefaultFenceName, DigestAnnotation, FenceDigest())
		for _, line := range bytes.SplitAfter(spec, []byte("\n")) {
			if len(line) > 0 {
				out.WriteString("  ")
				out.Write(line)
			}
		}
	}
	return out.Bytes(), nil
}

// EnsureFence creates or updates the fence (policy first, then binding) and
// reports whether it wrote anything. The chart installs it in a cluster; tests
// and the demo use this. A new or changed policy takes the API server up to
// about a second to enforce.
func EnsureFence(ctx context.Context, c client.Client, f Fence) (changed bool, err error) {
	const op = "gate.EnsureFence"
	policy, binding, err := f.Objects()
	if err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	for _, o := range []client.Object{policy, binding} {
		ch, err := ensure(ctx, c, o)
		if err != nil {
			return changed, fmt.Errorf("%s: %s %s: %w", op, o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
		changed = changed || ch
	}
	return changed, nil
}

func ensure(ctx context.Context, c client.Client, want client.Object) (bool, error) {
	current := want.DeepCopyObject().(client.Object)
	err := c.Get(ctx, client.ObjectKeyFromObject(want), current)
	switch {
	case apierrors.IsNotFound(err):
		return true, c.Create(ctx, want, client.FieldOwner(FieldOwner))
	case err != nil:
		return false, err
	}
	if current.GetAnnotations()[DigestAnnotation] == want.GetAnnotations()[DigestAnnotation] && equalJSON(spec(current), spec(want)) {
		return false, nil
	}
	want.SetResourceVersion(current.GetResourceVersion())
	return true, c.Update(ctx, want, client.FieldOwner(FieldOwner))
}

// DeleteFence removes the fence (binding first). Absent objects are not an
// error.
func DeleteFence(ctx context.Context, c client.Client, f Fence) error {
	const op = "gate.DeleteFence"
	for _, o := range []client.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: f.name()}},
		&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: f.name()}},
	} {
		if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("%s: %s: %w", op, f.name(), err)
		}
	}
	return nil
}

// FenceNamespace is the namespace whose native CCM ServiceAccounts an
// installed fence policy confines, read from its match condition; "" when it
// confines none that way (not a fence of this design).
func FenceNamespace(policy *admissionregistrationv1.ValidatingAdmissionPolicy) string {
	const head, tail = `request.userInfo.username.startsWith("system:serviceaccount:`, ":" + v1.ReleasePrefix + `")`
	for _, mc := range policy.Spec.MatchConditions {
		if ns, ok := strings.CutPrefix(mc.Expression, head); ok {
			if ns, ok = strings.CutSuffix(ns, tail); ok && len(validation.IsDNS1123Label(ns)) == 0 {
				return ns
			}
		}
	}
	return ""
}

// CheckFence reads the fence's policy and binding (by name: the coordinator
// may get these two objects and nothing else of admissionregistration) and
// reports ErrFenceNotInstalled when either is absent, of another version, or
// not binding the policy with Deny, or made for another namespace.
func CheckFence(ctx context.Context, r client.Reader, f Fence) error {
	_, err := ReadFence(ctx, r, f)
	return err
}

// InstalledFence is the data of an installed fence.
type InstalledFence struct {
	// Prefixes are the providerID prefixes of every platform.
	Prefixes map[string][]string
	// DomainKeys are the label keys a domain may restrict.
	DomainKeys []string
}

// ReadFence is CheckFence, and returns the providerID prefixes of every
// platform and the domain label keys that the installed fence enforces.
func ReadFence(ctx context.Context, r client.Reader, f Fence) (InstalledFence, error) {
	table, keys, err := readFence(ctx, r, f)
	return InstalledFence{Prefixes: table, DomainKeys: keys}, err
}

func readFence(ctx context.Context, r client.Reader, f Fence) (map[string][]string, []string, error) {
	const op = "gate.CheckFence"
	if err := f.Validate(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	name, want := f.name(), FenceDigest()
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, o := range []struct {
		kind string
		obj  client.Object
	}{{"ValidatingAdmissionPolicy", &policy}, {"ValidatingAdmissionPolicyBinding", &binding}} {
		err := r.Get(ctx, client.ObjectKey{Name: name}, o.obj)
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil, fmt.Errorf("%s: %w: %s %s does not exist (the ccm-coordinator chart installs it)", op, ErrFenceNotInstalled, o.kind, name)
		case err != nil:
			return nil, nil, fmt.Errorf("%s: %s %s: %w", op, o.kind, name, err)
		}
		if got := o.obj.GetAnnotations()[DigestAnnotation]; got != want {
			return nil, nil, fmt.Errorf("%s: %w: %s %s has fence digest %q, this coordinator expects %q (install the ccm-coordinator chart of the coordinator's version)", op, ErrFenceNotInstalled, o.kind, name, got, want)
		}
	}
	// The prefix table is data of the installed fence; everything else must
	// be exactly this coordinator's fence for its namespace.
	var table map[string][]string
	var keys []string
	for _, v := range policy.Spec.Variables {
		switch v.Name {
		case prefixesVariable:
			if err := json.Unmarshal([]byte(v.Expression), &table); err != nil {
				return nil, nil, fmt.Errorf("%s: %w: ValidatingAdmissionPolicy %s: the providerID prefixes are not a table (%v)", op, ErrFenceNotInstalled, name, err)
			}
		case domainKeysVariable:
			var err error
			if keys, err = parseDomainKeys(v.Expression); err != nil {
				return nil, nil, fmt.Errorf("%s: %w: ValidatingAdmissionPolicy %s: the domain label keys are not a list the fence can check (%v)", op, ErrFenceNotInstalled, name, err)
			}
		}
	}
	keyLit, err := DomainKeyLiteral(keys)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w: ValidatingAdmissionPolicy %s: %w", op, ErrFenceNotInstalled, name, err)
	}
	lit, err := prefixLiteral(table)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w: ValidatingAdmissionPolicy %s: %w", op, ErrFenceNotInstalled, name, err)
	}
	wantPolicy, wantBinding := f.render(f.Namespace, lit, keyLit)
	if err := copyIngress(wantPolicy, &policy); err != nil {
		return nil, nil, fmt.Errorf("%s: %w: ValidatingAdmissionPolicy %s: %w", op, ErrFenceNotInstalled, name, err)
	}
	if !equalJSON(policy.Spec, wantPolicy.Spec) {
		return nil, nil, fmt.Errorf("%s: %w: ValidatingAdmissionPolicy %s is not the fence for the native CCMs of namespace %s (installed for another namespace, or changed after install)", op, ErrFenceNotInstalled, name, f.Namespace)
	}
	if !equalJSON(binding.Spec, wantBinding.Spec) {
		return nil, nil, fmt.Errorf("%s: %w: ValidatingAdmissionPolicyBinding %s does not bind the fence with Deny (changed after install)", op, ErrFenceNotInstalled, name)
	}
	return table, keys, nil
}

func spec(o client.Object) any {
	switch o := o.(type) {
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		return o.Spec
	case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		return o.Spec
	}
	return nil
}

func equalJSON(a, b any) bool {
	x, errX := json.Marshal(a)
	y, errY := json.Marshal(b)
	return errX == nil && errY == nil && bytes.Equal(x, y)
}
