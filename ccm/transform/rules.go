package transform

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	cloudproviderapi "k8s.io/cloud-provider/api"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// program is a validated, compiled configuration.
type program struct {
	rules      []*rule
	system     bool      // some rule refers to SystemInformation
	producible OwnedKeys // every key some rule can produce
}

// rule is a compiled Transformation.
type rule struct {
	index       int
	name        string // Result.Matched entry: the name, or "#<index>"
	label       string // for messages
	terms       [][]matcher
	labels      []output
	annotations []output
	taints      []taintOutput
	overrides   []override
	// setsProviderID: the rule overrides providerID (see rule.apply).
	setsProviderID bool
	features       Features
	src            *Transformation // for names and lines in messages
}

// output is a label or annotation a rule sets.
type output struct {
	key, path string
	v         *value
}

type taintOutput struct {
	key, path string
	effect    corev1.TaintEffect
	v         *value
}

type override struct {
	ref  fieldRef
	path string
	v    *value
}

// matcher is a compiled Expression.
type matcher struct {
	path   string // nodeSelector[i].matchExpressions[j]
	ref    fieldRef
	op     Operator
	values []string
	num    int64
	res    []*regexp.Regexp
}

// Keys talos-ccm or the kubelet derive themselves; a rule setting them would
// fight with them.
var reservedLabels = map[string]string{
	corev1.LabelTopologyRegion:                     "it is derived from the metadata: override platformMetadata.region instead",
	corev1.LabelTopologyZone:                       "it is derived from the metadata: override platformMetadata.zone instead",
	corev1.LabelFailureDomainBetaRegion:            "it is derived from the metadata: override platformMetadata.region instead",
	corev1.LabelFailureDomainBetaZone:              "it is derived from the metadata: override platformMetadata.zone instead",
	corev1.LabelInstanceTypeStable:                 "it is derived from the metadata: override platformMetadata.instanceType instead",
	corev1.LabelInstanceType:                       "it is derived from the metadata: override platformMetadata.instanceType instead",
	names.PlatformLabel:                            "it is talos-ccm's routing label, derived from the platform: override platformMetadata.platform instead",
	"node.cloudprovider.kubernetes.io/clustername": "it is set from global.clusterName (else the cluster of the talosconfig context)",
	"node.cloudprovider.kubernetes.io/lifecycle":   "it is derived from the metadata: override platformMetadata.spot instead",
	corev1.LabelHostname:                           "the kubelet sets it",
	corev1.LabelOSStable:                           "the kubelet sets it",
	corev1.LabelArchStable:                         "the kubelet sets it",
}

var reservedAnnotations = map[string]string{
	OwnedKeysAnnotation:                            "enforce mode records the keys rules own in it",
	cloudproviderapi.AnnotationAlphaProvidedIPAddr: "the kubelet sets it",
}

// reservedTaint explains why a rule may not set a taint key, or returns "".
func reservedTaint(key string) string {
	switch {
	case strings.HasPrefix(key, "node.kubernetes.io/"):
		return "the node.kubernetes.io/ taints belong to Kubernetes' node controllers and the scheduler"
	case key == names.UninitializedTaint, key == cloudproviderapi.TaintNodeShutdown:
		return "the cloud node controllers set it"
	}
	return ""
}

var taintEffects = []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute}

// compile validates every rule and returns all errors found.
func compile(c *Config) (*program, []error) {
	p := &program{}
	var errs []error
	names := map[string]int{}
	labels, annotations, taints := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for i := range c.Transformations {
		t := &c.Transformations[i]
		r := &rule{index: i, name: t.Name, label: ruleLabel(i, t.Name), features: t.Features, src: t}
		if r.name == "" {
			r.name = "#" + strconv.Itoa(i)
		}
		fail := func(path string, format string, a ...any) {
			if t.reported(path) {
				return
			}
			errs = append(errs, &Error{Source: c.source, Line: t.line(path), Rule: r.label, Field: path, Err: fmt.Errorf(format, a...)})
		}

		if t.Name != "" {
			if j, dup := names[t.Name]; dup {
				fail("name", "duplicate rule name (also transformations[%d])", j)
			}
			names[t.Name] = i
		}

		for ti, term := range t.NodeSelector {
			tp := fmt.Sprintf("nodeSelector[%d]", ti)
			if len(term.MatchExpressions) == 0 {
				fail(tp+".matchExpressions", "must not be empty (a term without expressions would match no node)")
			}
			var ms []matcher
			for ei, e := range term.MatchExpressions {
				ep := fmt.Sprintf("%s.matchExpressions[%d]", tp, ei)
				m, path, err := compileExpression(e)
				if err != nil {
					fail(ep+path, "%v", err)
					continue
				}
				m.path = ep
				p.system = p.system || m.ref.system()
				ms = append(ms, m)
			}
			r.terms = append(r.terms, ms)
		}

		for _, k := range sortedKeys(t.Labels) {
			path := keyPath("labels", k)
			for _, msg := range validation.IsQualifiedName(k) {
				fail(path, "invalid label key: %s", msg)
			}
			if why, ok := reservedLabels[k]; ok {
				fail(path, "rules may not set this label: %s", why)
			}
			v, err := compileValue(t.Labels[k])
			if err != nil {
				fail(path, "%v", err)
				continue
			}
			if v.constant() {
				for _, msg := range validation.IsValidLabelValue(strings.TrimSpace(v.text)) {
					fail(path, "invalid label value %q: %s", v.text, msg)
				}
			}
			p.system = p.system || v.system
			labels[k] = true
			r.labels = append(r.labels, output{key: k, path: path, v: v})
		}

		for _, k := range sortedKeys(t.Annotations) {
			path := keyPath("annotations", k)
			for _, msg := range validation.IsQualifiedName(strings.ToLower(k)) {
				fail(path, "invalid annotation key: %s", msg)
			}
			if why, ok := reservedAnnotations[k]; ok {
				fail(path, "rules may not set this annotation: %s", why)
			}
			v, err := compileValue(t.Annotations[k])
			if err != nil {
				fail(path, "%v", err)
				continue
			}
			p.system = p.system || v.system
			annotations[k] = true
			r.annotations = append(r.annotations, output{key: k, path: path, v: v})
		}

		for ti, tt := range t.Taints {
			path := tt.path
			keyField, valueField, effectField := path, path, path
			if !strings.HasPrefix(path, `taints["`) { // list form
				path = fmt.Sprintf("taints[%d]", ti)
				keyField, valueField, effectField = path+".key", path+".value", path+".effect"
			}
			ok := true
			if tt.Key == "" {
				fail(keyField, "key is required")
				ok = false
			} else {
				for _, msg := range validation.IsQualifiedName(tt.Key) {
					fail(keyField, "invalid taint key %q: %s", tt.Key, msg)
					ok = false
				}
			}
			if why := reservedTaint(tt.Key); why != "" {
				fail(keyField, "rules may not set taint %q: %s", tt.Key, why)
				ok = false
			}
			effect := corev1.TaintEffect(tt.Effect)
			if !slices.Contains(taintEffects, effect) {
				fail(effectField, "invalid taint effect %q: must be NoSchedule, PreferNoSchedule or NoExecute (map form: key: \"value:Effect\")", tt.Effect)
				ok = false
			}
			v, err := compileValue(tt.Value)
			if err != nil {
				fail(valueField, "%v", err)
				continue
			}
			if v.constant() {
				for _, msg := range validation.IsValidLabelValue(strings.TrimSpace(v.text)) {
					fail(valueField, "invalid taint value %q: %s", v.text, msg)
				}
			}
			if !ok {
				continue
			}
			p.system = p.system || v.system
			taints[tt.Key+":"+tt.Effect] = true
			r.taints = append(r.taints, taintOutput{key: tt.Key, path: path, effect: effect, v: v})
		}

		overridden := map[string]string{}
		for _, k := range sortedKeys(t.PlatformMetadata) {
			path := keyPath("platformMetadata", k)
			ref, ok := resolveKey(k)
			switch {
			case !ok:
				fail(path, "unknown metadata field; fields rules may override are %s", overridableKeys())
				continue
			case !ref.overridable() && ref.f.system:
				fail(path, "%s is hardware information and cannot be overridden", ref)
				continue
			case !ref.overridable():
				fail(path, "%s cannot be overridden: it identifies the node", ref)
				continue
			}
			if prev, dup := overridden[ref.String()]; dup {
				fail(path, "%s is already overridden by platformMetadata[%q]", ref, prev)
				continue
			}
			overridden[ref.String()] = k
			v, err := compileValue(t.PlatformMetadata[k])
			if err != nil {
				fail(path, "%v", err)
				continue
			}
			if v.constant() && ref.f != nil {
				var probe Metadata
				if err := ref.override(&probe, strings.TrimSpace(v.text)); err != nil {
					fail(path, "%v", err)
				}
			}
			p.system = p.system || v.system
			r.overrides = append(r.overrides, override{ref: ref, path: path, v: v})
			r.setsProviderID = r.setsProviderID || ref.f == fieldsByKey["providerid"]
		}
		p.rules = append(p.rules, r)
	}
	p.producible = OwnedKeys{Labels: sortedKeys(labels), Annotations: sortedKeys(annotations), Taints: sortedKeys(taints)}
	return p, errs
}

// compileExpression validates one expression; on error it also returns the
// path below the expression that is wrong (".operator", ".values[0]", ...).
func compileExpression(e Expression) (matcher, string, error) {
	m := matcher{op: e.Operator, values: e.Values}
	if e.Key == "" {
		return m, ".key", fmt.Errorf("key is required")
	}
	ref, ok := resolveKey(e.Key)
	if !ok {
		return m, ".key", fmt.Errorf("unknown metadata key %q; keys are %s (case-insensitive)", e.Key, matchableKeys())
	}
	m.ref = ref
	switch e.Operator {
	case OpIn, OpNotIn:
		if len(e.Values) == 0 {
			return m, ".values", fmt.Errorf("%s needs at least one value", e.Operator)
		}
	case OpExists, OpDoesNotExist:
		if len(e.Values) != 0 {
			return m, ".values", fmt.Errorf("%s takes no values", e.Operator)
		}
	case OpGt, OpLt:
		if len(e.Values) != 1 {
			return m, ".values", fmt.Errorf("%s needs exactly one integer value, got %d values", e.Operator, len(e.Values))
		}
		n, err := strconv.ParseInt(strings.TrimSpace(e.Values[0]), 10, 64)
		if err != nil {
			return m, ".values[0]", fmt.Errorf("%s needs an integer, got %q", e.Operator, e.Values[0])
		}
		m.num = n
	case OpRegexp:
		if len(e.Values) == 0 {
			return m, ".values", fmt.Errorf("Regexp needs at least one pattern")
		}
		for i, v := range e.Values {
			re, err := regexp.Compile(v)
			if err != nil {
				return m, fmt.Sprintf(".values[%d]", i), fmt.Errorf("invalid regexp %q: %v", v, err)
			}
			m.res = append(m.res, re)
		}
	case "":
		return m, ".operator", fmt.Errorf("operator is required (%s)", operatorList())
	default:
		hint := ""
		for _, op := range operators {
			if strings.EqualFold(string(op), string(e.Operator)) {
				hint = fmt.Sprintf(" (did you mean %s?)", op)
			}
		}
		return m, ".operator", fmt.Errorf("unknown operator %q%s; operators are %s", e.Operator, hint, operatorList())
	}
	return m, "", nil
}

func operatorList() string {
	s := make([]string, len(operators))
	for i, op := range operators {
		s[i] = string(op)
	}
	return strings.Join(s, ", ")
}

// match evaluates the expression; why explains a false result when explain is set.
func (m *matcher) match(md *Metadata, explain bool) (ok bool, why string) {
	v, present := m.ref.lookup(md)
	if m.op == OpDoesNotExist {
		if present && explain {
			why = fmt.Sprintf("%s is present (%q)", m.ref, v)
		}
		return !present, why
	}
	if !present {
		if explain {
			why = fmt.Sprintf("%s is absent", m.ref)
		}
		return false, why
	}
	switch m.op {
	case OpExists:
		return true, ""
	case OpIn:
		ok = slices.Contains(m.values, v)
		if !ok && explain {
			why = fmt.Sprintf("%s %q is not in %q", m.ref, v, m.values)
		}
	case OpNotIn:
		ok = !slices.Contains(m.values, v)
		if !ok && explain {
			why = fmt.Sprintf("%s %q is in %q", m.ref, v, m.values)
		}
	case OpGt, OpLt:
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			if explain {
				why = fmt.Sprintf("%s %q is not an integer", m.ref, v)
			}
			return false, why
		}
		ok = m.op == OpGt && n > m.num || m.op == OpLt && n < m.num
		if !ok && explain {
			rel := "greater"
			if m.op == OpLt {
				rel = "less"
			}
			why = fmt.Sprintf("%s %d is not %s than %d", m.ref, n, rel, m.num)
		}
	case OpRegexp:
		ok = slices.ContainsFunc(m.res, func(re *regexp.Regexp) bool { return re.MatchString(v) })
		if !ok && explain {
			why = fmt.Sprintf("%s %q matches none of %q", m.ref, v, m.values)
		}
	}
	return ok, why
}

// match reports whether the rule applies to md: the index of the first
// matching term (-1 without a selector) or, when it does not and explain is
// set, one reason per term.
func (r *rule) match(md *Metadata, explain bool) (matched bool, term int, misses []string) {
	if len(r.terms) == 0 {
		return true, -1, nil
	}
	for ti, term := range r.terms {
		all := true
		for _, m := range term {
			ok, why := m.match(md, explain)
			if !ok {
				all = false
				if explain {
					misses = append(misses, fmt.Sprintf("%s: %s", m.path, why))
				}
				break
			}
		}
		if all {
			return true, ti, nil
		}
	}
	return false, -1, misses
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
