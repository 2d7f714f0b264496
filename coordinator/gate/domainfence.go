package gate

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/domain"
)

// Domains in the fence.
//
// A NativeCCM owns a domain (coordinator/domain): the nodes of its platform
// whose labels carry given values. The fence knows a short list of label keys
// that may bound a domain (domainKeysVariable: the profiles' domain labels and
// v1.DomainLabel, data the chart renders like the providerID prefixes), and
// the grant says, per key, whether the NativeCCM is restricted on it
// (domainkeys/<key>) and which values it owns (domains/<key>=<value>). For
// every key of the list, a node write of a restricted NativeCCM needs the
// node's current value (oldObject: what the node is now, whatever the request
// says) to be granted. A grant without domain rules is the whole platform, as
// before domains existed.
//
// A split NativeCCM runs one release per value of a boundary label; each
// member's ServiceAccount is native-ccm-<name>--<value>. A member holds
// no grant of its own: the fence asks the authorizer about its NativeCCM's
// ServiceAccount (native-ccm-<name>) for everything, and a member may change
// only nodes whose split label is exactly its own value, when that grant
// names the split (splits/<key>). Members serve no Services.
//
// The authorizer library prices a check at about a third of an expression's
// cost limit, so each key has its own expressions (domainSlots of them),
// each with at most two checks.
const (
	grantDomainKeys = "domainkeys"
	grantDomains    = "domains"
	grantSplits     = "splits"
	// domainSlots is how many domain label keys the fence can check.
	domainSlots = 4
	// domainKeysVariable holds the list of keys, a JSON (CEL) list literal.
	domainKeysVariable = "domainKeys"
	digestDomainKeys   = "@DOMAIN_KEYS@"
)

// BuiltinDomainKeys are the domain label keys the fence knows without
// configuration (domain.BuiltinKeys).
var BuiltinDomainKeys = domain.BuiltinKeys

// DomainKeyLiteral writes a list of domain keys as the fence holds it: JSON,
// sorted, unique, at most domainSlots, each a qualified label key.
func DomainKeyLiteral(keys []string) (string, error) {
	keys = sortedUnique(keys)
	if len(keys) > domainSlots {
		return "", fmt.Errorf("%w: %d domain label keys (%s): the fence checks at most %d", ErrConfig, len(keys), strings.Join(keys, ", "), domainSlots)
	}
	for _, k := range keys {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			return "", fmt.Errorf("%w: domain label key %q: %s", ErrConfig, k, strings.Join(msgs, "; "))
		}
	}
	buf, err := json.Marshal(keys)
	return string(buf), err
}

// parseDomainKeys reads the list back from an installed fence.
func parseDomainKeys(expr string) ([]string, error) {
	var keys []string
	if err := json.Unmarshal([]byte(expr), &keys); err != nil {
		return nil, err
	}
	if _, err := DomainKeyLiteral(keys); err != nil {
		return nil, err
	}
	return sortedUnique(keys), nil
}

// domainVariables are the fence's CEL variables about domains and split
// members. keys is the literal of domainKeysVariable.
func domainVariables(namespace, keys string) []admissionregistrationv1.Variable {
	sep := celString(domain.SplitSeparator)
	vars := []admissionregistrationv1.Variable{
		// Split members: native-ccm-<parent>--<slug>.
		{Name: "parent", Expression: "variables.nativeCCM.indexOf(" + sep + ") < 0 ? variables.nativeCCM : variables.nativeCCM.substring(0, variables.nativeCCM.indexOf(" + sep + "))"},
		{Name: "splitValue", Expression: "variables.nativeCCM.indexOf(" + sep + ") < 0 ? '' : variables.nativeCCM.substring(variables.nativeCCM.indexOf(" + sep + ") + " + strconv.Itoa(len(domain.SplitSeparator)) + ")"},
		// Whose grant counts: the NativeCCM's ServiceAccount, for a member too.
		{Name: "grantNamespace", Expression: celString(namespace)},
		{Name: "grantee", Expression: celString(v1.ReleasePrefix) + " + variables.parent"},
		{Name: domainKeysVariable, Expression: keys},
		{Name: "nodeLabels", Expression: "variables.isService || request.operation == 'CREATE' ? {} : oldObject.metadata.?labels.orValue({})"},
	}
	for i := 0; i < domainSlots; i++ {
		key := fmt.Sprintf("variables.%s[%d]", domainKeysVariable, i)
		value := "variables.nodeLabels[?" + key + "].orValue('')"
		present := fmt.Sprintf("size(variables.%s) > %d", domainKeysVariable, i)
		vars = append(vars,
			// "" when the node is in the domain on this key, else the key.
			admissionregistrationv1.Variable{Name: fmt.Sprintf("outside%d", i), Expression: "!(" + present + ") || !" + grantCheck(grantDomainKeys, key) +
				" || " + grantCheck(grantDomains, key+" + '=' + "+value) + " ? '' : " + key},
			// the key when the NativeCCM is split by it.
			admissionregistrationv1.Variable{Name: fmt.Sprintf("split%d", i), Expression: "variables.splitValue != '' && " + present + " && " + grantCheck(grantSplits, key) + " ? " + key + " : ''"},
		)
	}
	var outside, splits []string
	for i := 0; i < domainSlots; i++ {
		outside = append(outside, fmt.Sprintf("variables.outside%d", i))
		splits = append(splits, fmt.Sprintf("variables.split%d", i))
	}
	vars = append(vars,
		admissionregistrationv1.Variable{Name: "outsideKeys", Expression: "[" + strings.Join(outside, ", ") + "].filter(k, k != '')"},
		admissionregistrationv1.Variable{Name: "splitKeys", Expression: "variables.splitValue == '' ? [] : [" + strings.Join(splits, ", ") + "].filter(k, k != '')"},
		// the node's value itself: a member's name carries the value exactly
		// (values that are no DNS label cannot be split), so two values never
		// meet in one member
		admissionregistrationv1.Variable{Name: "nodeSlug", Expression: "size(variables.splitKeys) != 1 ? '' : variables.nodeLabels[?variables.splitKeys[0]].orValue('')"},
	)
	return vars
}

// domainValidations refuse node writes outside the requester's domain and
// everything of a split member its NativeCCM's grant does not split.
// node guards a validation to nodes; who names the requester.
func domainValidations(node func(string) string, who string) []admissionregistrationv1.Validation {
	// Message expressions cannot ask the authorizer: they name the node's
	// domain labels, and the grant to look at.
	labels := "variables.domainKeys.map(k, k + '=' + variables.nodeLabels[?k].orValue('(none)')).join(', ')"
	return []admissionregistrationv1.Validation{
		{
			Expression: "variables.splitValue == '' || size(variables.splitKeys) == 1",
			Message:    "hybrid-ccm gate: a split member's ServiceAccount (native-ccm-<name>--<value>) may change nothing unless its NativeCCM's grant names one split label",
			MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not change anything: it is named as a split member of NativeCCM "), "variables.parent",
				lit(", and the grant "+GrantPrefix), "variables.parent", lit(" names no split label ("+GrantGroup+" "+grantSplits+"/<label>), or several")),
			Reason: ptr.To(metav1.StatusReasonForbidden),
		},
		{
			Expression:        "!variables.isService || variables.splitValue == ''",
			Message:           "hybrid-ccm gate: a split member serves no Services",
			MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not change Service "), "request.namespace + '/' + request.name", lit(": a split member of NativeCCM "), "variables.parent", lit(" serves no load balancers")),
			Reason:            ptr.To(metav1.StatusReasonForbidden),
		},
		{
			Expression: node("size(variables.outsideKeys) == 0"),
			Message:    "hybrid-ccm gate: a native CCM may only change nodes of its domain",
			MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not change or delete node "), "request.name",
				lit(": it is outside the domain of NativeCCM "), "variables.parent", lit(" (its grant "+GrantPrefix), "variables.parent",
				lit(" names the "+grantDomains+"/<label>=<value> it owns); the node's domain labels are "), labels),
			Reason: ptr.To(metav1.StatusReasonForbidden),
		},
		{
			Expression: node("variables.splitValue == '' || variables.nodeSlug == variables.splitValue"),
			Message:    "hybrid-ccm gate: a split member may only change nodes of its own value of the split label",
			MessageExpression: cel(lit("hybrid-ccm gate: "), who, lit(" may not change or delete node "), "request.name",
				lit(": it is the split member of NativeCCM "), "variables.parent", lit(" for the value "), "variables.splitValue",
				lit(" of the split label; the node's domain labels are "), labels),
			Reason: ptr.To(metav1.StatusReasonForbidden),
		},
	}
}

// DomainGrant is what a grant says about the domain: per restricted key, the
// values owned; and the label a split NativeCCM's members are split by.
type DomainGrant struct {
	Require map[string][]string
	SplitBy string
}

func (d DomainGrant) rules(rule func(string, ...string) ruleT) []ruleT {
	var out []ruleT
	keys := sortedKeys(d.Require)
	if len(keys) > 0 {
		out = append(out, rule(grantDomainKeys, keys...))
		var names []string
		for _, k := range keys {
			for _, v := range d.Require[k] {
				names = append(names, k+"="+v)
			}
		}
		out = append(out, rule(grantDomains, names...))
	}
	if d.SplitBy != "" {
		out = append(out, rule(grantSplits, d.SplitBy))
	}
	return out
}

// wants are what CheckGrant asks the authorizer for.
func (d DomainGrant) wants() []want {
	var out []want
	for _, k := range sortedKeys(d.Require) {
		out = append(out, want{grantDomainKeys, k, "domain label " + k})
		for _, v := range d.Require[k] {
			out = append(out, want{grantDomains, k + "=" + v, "domain " + k + "=" + v})
		}
	}
	if d.SplitBy != "" {
		out = append(out, want{grantSplits, d.SplitBy, "the split by " + d.SplitBy})
	}
	return out
}

func sortedKeys(m map[string][]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
