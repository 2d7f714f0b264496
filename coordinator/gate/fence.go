package gate

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

const (
	// policyPrefix starts the name of every fence policy and binding.
	policyPrefix = "hybridccm-fence-"
	// DigestAnnotation records the digest of the desired fence on its objects;
	// EnsurePolicy writes only when it changes.
	DigestAnnotation = "hybridccm.io/fence-digest"
	// FieldOwner is the field manager of the fence objects.
	FieldOwner = "ccm-coordinator"
)

// Fence is the admission policy of one NativeCCM.
type Fence struct {
	// NativeCCM is the name of the NativeCCM; it names the policy and appears in
	// every denial.
	NativeCCM string
	// Platform is the value of the platform label the CCM owns.
	Platform string
	// Username is the API server user name of the CCM's ServiceAccount,
	// system:serviceaccount:<namespace>:<name> (release.Lifecycle.Username).
	Username string
	// ProviderIDPrefixes are the profile's providerID prefixes.
	ProviderIDPrefixes []string
	// PlatformLabel is the routing label key; default v1alpha1.PlatformLabel.
	PlatformLabel string
	// Owner, when set, owns the policy and binding (the NativeCCM), so that they
	// are garbage-collected with it.
	Owner *metav1.OwnerReference
}

// ErrConfig marks errors that only a change of the NativeCCM or its profile
// can fix (an empty platform, no providerID prefixes, ...). Other errors from
// this package are API errors worth retrying.
var ErrConfig = errors.New("invalid gate configuration")

// PolicyName is the name of the policy and of its binding for a NativeCCM.
func PolicyName(nativeCCM string) string { return policyPrefix + nativeCCM }

// Policy renders the fence of a NativeCCM: see Fence.Objects.
func Policy(nativeCCM, platform, username string, providerIDPrefixes []string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	return Fence{NativeCCM: nativeCCM, Platform: platform, Username: username, ProviderIDPrefixes: providerIDPrefixes}.Objects()
}

func (f Fence) label() string {
	if f.PlatformLabel == "" {
		return v1.PlatformLabel
	}
	return f.PlatformLabel
}

// Validate reports fields that would make a fence meaningless or open.
func (f Fence) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Subdomain(PolicyName(f.NativeCCM)); f.NativeCCM == "" || len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("nativeCCM %q: not usable in a policy name: %s", f.NativeCCM, strings.Join(msgs, "; ")))
	}
	// An empty platform would match every unlabelled node.
	if msgs := validation.IsValidLabelValue(f.Platform); f.Platform == "" || len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("platform %q: must be a non-empty label value: %s", f.Platform, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsQualifiedName(f.label()); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("platformLabel %q: %s", f.label(), strings.Join(msgs, "; ")))
	}
	if !strings.HasPrefix(f.Username, "system:serviceaccount:") || strings.Count(f.Username, ":") != 3 {
		errs = append(errs, fmt.Errorf("username %q: want system:serviceaccount:<namespace>:<name>", f.Username))
	}
	if len(f.ProviderIDPrefixes) == 0 {
		errs = append(errs, errors.New("providerIDPrefixes: at least one is required"))
	}
	for i, p := range f.ProviderIDPrefixes {
		// A prefix must at least end the scheme: "" or "h" would match foreign IDs.
		if !strings.Contains(p, ":") {
			errs = append(errs, fmt.Errorf("providerIDPrefixes[%d] %q: must contain the scheme (e.g. hcloud://)", i, p))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: fence of NativeCCM %q: %w", ErrConfig, f.NativeCCM, errors.Join(errs...))
	}
	return nil
}

// Objects renders the ValidatingAdmissionPolicy and its binding.
//
// The policy matches CREATE, UPDATE (which includes PATCH) and DELETE of nodes
// and nodes/status, only for requests by the CCM's user (matchConditions), with
// failurePolicy Fail so that an evaluation error denies. It holds the facts
// verified on real API servers: object is null on DELETE and every object read
// is guarded; absent labels and providerIDs are read with CEL optionals.
func (f Fence) Objects() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	if err := f.Validate(); err != nil {
		return nil, nil, err
	}
	name := PolicyName(f.NativeCCM)
	label := celString(f.label())
	platform := celString(f.Platform)
	prefixes := make([]string, len(f.ProviderIDPrefixes))
	for i, p := range f.ProviderIDPrefixes {
		prefixes[i] = celString(p)
	}
	who := "NativeCCM " + f.NativeCCM + " (" + f.Username + ")"
	prefixList := "[" + strings.Join(prefixes, ", ") + "]"
	verb := `(request.operation == 'DELETE' ? 'delete' : (request.?subResource.orValue('') == '' ? 'change' : 'change the ' + request.subResource + ' of'))`

	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: f.meta(name),
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
							// nodes/status too: status patches are a separate resource.
							Resources: []string{"nodes", "nodes/status"},
							Scope:     ptr.To(admissionregistrationv1.AllScopes),
						},
					},
				}},
			},
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "native-ccm-identity",
				Expression: "request.userInfo.username == " + celString(f.Username),
			}},
			Variables: append([]admissionregistrationv1.Variable{
				{Name: "oldPlatform", Expression: "request.operation == 'CREATE' ? '' : oldObject.metadata.?labels[?" + label + "].orValue('')"},
				{Name: "oldProviderID", Expression: "request.operation == 'CREATE' ? '' : oldObject.?spec.?providerID.orValue('')"},
				{Name: "newPlatform", Expression: "request.operation == 'UPDATE' ? object.metadata.?labels[?" + label + "].orValue('') : ''"},
				{Name: "newProviderID", Expression: "request.operation == 'UPDATE' ? object.?spec.?providerID.orValue('') : ''"},
				{Name: "ownProviderID", Expression: "variables.oldProviderID != '' && " + prefixList + ".exists(p, variables.oldProviderID.startsWith(p))"},
			}, changeVariables()...),
			Validations: append([]admissionregistrationv1.Validation{
				{
					Expression: "request.operation != 'CREATE'",
					Message:    "hybrid-ccm gate: " + who + " may not create nodes",
					Reason:     ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: "request.operation == 'CREATE' || variables.oldPlatform == " + platform,
					Message:    "hybrid-ccm gate: " + who + " may only change nodes labelled " + f.label() + "=" + f.Platform,
					MessageExpression: cel(lit("hybrid-ccm gate: "+who+" may not "), verb, lit(" node "), "request.name",
						lit(": its label "+f.label()+" is "),
						"(variables.oldPlatform == '' ? 'missing' : '\"' + variables.oldPlatform + '\"')",
						lit(", not \""+f.Platform+"\"")),
					Reason: ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression: "request.operation == 'CREATE' || variables.ownProviderID",
					Message:    "hybrid-ccm gate: " + who + " may only change nodes whose providerID starts with " + strings.Join(f.ProviderIDPrefixes, " or "),
					MessageExpression: cel(lit("hybrid-ccm gate: "+who+" may not "), verb, lit(" node "), "request.name", lit(": "),
						"(variables.oldProviderID == '' ? "+lit("it has no providerID (an empty providerID is never proof)")+
							" : "+cel(lit("its providerID \""), "variables.oldProviderID", lit("\" does not start with "+strings.Join(f.ProviderIDPrefixes, " or ")))+")"),
					Reason: ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression:        "request.operation != 'UPDATE' || variables.newPlatform == " + platform,
					Message:           "hybrid-ccm gate: " + who + " may not change the label " + f.label(),
					MessageExpression: cel(lit("hybrid-ccm gate: "+who+" may not change the label "+f.label()+" of node "), "request.name"),
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
				{
					Expression:        "request.operation != 'UPDATE' || variables.newProviderID == variables.oldProviderID",
					Message:           "hybrid-ccm gate: " + who + " may not set or change a providerID",
					MessageExpression: cel(lit("hybrid-ccm gate: "+who+" may not set or change the providerID of node "), "request.name"),
					Reason:            ptr.To(metav1.StatusReasonForbidden),
				},
			}, changeValidations(who)...),
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: f.meta(name),
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	d := digest(policy.Spec, binding.Spec, f.Owner)
	policy.Annotations = map[string]string{DigestAnnotation: d}
	binding.Annotations = map[string]string{DigestAnnotation: d}
	return policy, binding, nil
}

func (f Fence) meta(name string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{
		Name: name,
		Labels: map[string]string{
			release.ManagedByLabel: release.ManagedByValue,
			release.PlatformLabel:  f.Platform,
			nativeCCMLabel:         f.NativeCCM,
		},
	}
	if f.Owner != nil {
		m.OwnerReferences = []metav1.OwnerReference{*f.Owner}
	}
	return m
}

// nativeCCMLabel names the NativeCCM (not the release) a fence belongs to.
const nativeCCMLabel = "hybridccm.io/nativeccm"

func digest(parts ...any) string {
	b, _ := json.Marshal(parts)
	return fmt.Sprintf("%x", sha256.Sum256(b))[:16]
}

// celString quotes s as a CEL string literal (Go's double-quoted escapes are a
// subset of CEL's). Every value that comes from a profile or NativeCCM enters
// an expression only through it.
func celString(s string) string { return strconv.Quote(s) }

// lit is celString, short for message expressions.
func lit(s string) string { return celString(s) }

// cel concatenates CEL string expressions.
func cel(parts ...string) string { return "(" + strings.Join(parts, " + ") + ")" }

// EnsurePolicy creates or updates the fence of a NativeCCM (policy first, then
// binding) and reports whether it wrote anything. A new or changed policy takes
// the API server up to about a second to enforce.
func EnsurePolicy(ctx context.Context, c client.Client, f Fence) (changed bool, err error) {
	const op = "gate.EnsurePolicy"
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
	if current.GetAnnotations()[DigestAnnotation] == want.GetAnnotations()[DigestAnnotation] &&
		hasLabels(current.GetLabels(), want.GetLabels()) {
		return false, nil
	}
	want.SetResourceVersion(current.GetResourceVersion())
	return true, c.Update(ctx, want, client.FieldOwner(FieldOwner))
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// DeletePolicy removes the fence of a NativeCCM (binding first). Absent objects
// are not an error.
func DeletePolicy(ctx context.Context, c client.Client, nativeCCM string) error {
	const op = "gate.DeletePolicy"
	name := PolicyName(nativeCCM)
	for _, o := range []client.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}},
		&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}},
	} {
		if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("%s: %s: %w", op, name, err)
		}
	}
	return nil
}

// OwnerReference makes a NativeCCM the owner of its fence.
func OwnerReference(obj *v1.NativeCCM) *metav1.OwnerReference {
	return &metav1.OwnerReference{
		APIVersion:         v1.GroupVersion.String(),
		Kind:               v1.NativeCCMKind,
		Name:               obj.Name,
		UID:                obj.UID,
		BlockOwnerDeletion: ptr.To(true),
	}
}
