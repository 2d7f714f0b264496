package transform

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// maxAnnotationBytes is the API server's limit on the total size of a
// node's annotations (keys and values); rule output alone must stay below it.
const maxAnnotationBytes = 256 << 10

// Result is what the matching rules give one node.
type Result struct {
	// Metadata after the platformMetadata overrides of all matched rules, in order.
	Metadata Metadata
	// Labels, Annotations and Taints the matched rules produce; for a key
	// (taint: key and effect) set by several rules, the last one wins.
	Labels      map[string]string
	Annotations map[string]string
	Taints      []corev1.Taint
	// Features is the OR of the matched rules' features.
	Features Features
	// Matched names the matched rules in order ("#<index>" when unnamed).
	Matched []string
	// Producible lists every key any rule of the configuration can produce,
	// whether or not it matched this node. Enforce mode removes a key that
	// a kubelet may not change itself only if it is listed here (see Plan).
	Producible OwnedKeys
}

// RuleOutcome explains what one rule did for a node.
type RuleOutcome struct {
	Index   int    `json:"index"`
	Name    string `json:"name,omitempty"`
	Matched bool   `json:"matched"`
	// Term is the index of the nodeSelector term that matched; -1 if the
	// rule has no selector (it matches every node) or did not match.
	Term int `json:"term"`
	// Misses says, for a rule that did not match, why each term failed: the
	// first expression of the term that did not hold.
	Misses []string `json:"misses,omitempty"`
}

// Explanation is Apply's result with the reasons.
type Explanation struct {
	// Rules has one outcome per rule evaluated, in order.
	Rules []RuleOutcome
	// Result is nil when a rule failed.
	Result *Result
}

// Apply evaluates the rules in order against md. A matching rule's values
// are rendered against the metadata as it is when the rule is reached
// (earlier rules' overrides included); its own overrides apply to the rules
// after it. Template failures and rendered values Kubernetes would reject are
// errors (*Error) naming the rule and the key; Apply never panics.
func (c *Config) Apply(md Metadata) (*Result, error) {
	ex, err := c.evaluate(md, false)
	if err != nil {
		return nil, err
	}
	return ex.Result, nil
}

// Explain is Apply that also reports, rule by rule, whether it matched and
// why not. On error the explanation covers the rules up to the failing one.
func (c *Config) Explain(md Metadata) (*Explanation, error) {
	return c.evaluate(md, true)
}

func (c *Config) evaluate(md Metadata, explain bool) (*Explanation, error) {
	prog, err := c.program()
	if err != nil {
		return &Explanation{}, err
	}
	md = md.clone()
	res := &Result{
		Labels:      map[string]string{},
		Annotations: map[string]string{},
		Producible:  prog.producible.clone(),
	}
	ex := &Explanation{}
	if len(prog.rules) > 0 {
		if n := metadataSize(&md); n > MaxMetadataBytes {
			return ex, &Error{Source: c.source, Field: "metadata", Err: fmt.Errorf("the node reports %d bytes of metadata, more than %d: rules not applied", n, MaxMetadataBytes)}
		}
	}
	taints := map[string]int{} // key:effect → index in res.Taints
	for _, r := range prog.rules {
		matched, term, misses := r.match(&md, explain)
		if explain {
			ex.Rules = append(ex.Rules, RuleOutcome{Index: r.index, Name: r.src.Name, Matched: matched, Term: term, Misses: misses})
		}
		if !matched {
			continue
		}
		if err := r.apply(&md, res, taints, c.source); err != nil {
			return ex, err
		}
		res.Matched = append(res.Matched, r.name)
	}
	size := 0
	for k, v := range res.Annotations {
		size += len(k) + len(v)
	}
	if size > maxAnnotationBytes {
		return ex, &Error{Source: c.source, Field: "annotations", Err: fmt.Errorf("rules produce %d bytes of annotations, more than the API server's %d", size, maxAnnotationBytes)}
	}
	res.Metadata = md
	ex.Result = res
	return ex, nil
}

// apply renders the rule's output against md into res, then applies its
// metadata overrides to md.
func (r *rule) apply(md *Metadata, res *Result, taints map[string]int, source string) error {
	fail := func(path string, err error) error {
		return &Error{Source: source, Line: r.src.line(path), Rule: r.label, Field: path, Err: err}
	}
	for _, l := range r.labels {
		s, err := l.v.render(md)
		if err != nil {
			return fail(l.path, err)
		}
		s = strings.TrimSpace(s)
		if msgs := validation.IsValidLabelValue(s); len(msgs) > 0 {
			return fail(l.path, fmt.Errorf("rendered %q, not a valid label value: %s", s, strings.Join(msgs, "; ")))
		}
		res.Labels[l.key] = s
	}
	for _, a := range r.annotations {
		s, err := a.v.render(md)
		if err != nil {
			return fail(a.path, err)
		}
		res.Annotations[a.key] = s
	}
	for _, t := range r.taints {
		s, err := t.v.render(md)
		if err != nil {
			return fail(t.path, err)
		}
		s = strings.TrimSpace(s)
		if msgs := validation.IsValidLabelValue(s); len(msgs) > 0 {
			return fail(t.path, fmt.Errorf("rendered %q, not a valid taint value: %s", s, strings.Join(msgs, "; ")))
		}
		taint := corev1.Taint{Key: t.key, Value: s, Effect: t.effect}
		id := TaintID(taint)
		if i, ok := taints[id]; ok {
			res.Taints[i] = taint
		} else {
			taints[id] = len(res.Taints)
			res.Taints = append(res.Taints, taint)
		}
	}
	values := make([]string, len(r.overrides))
	for i, o := range r.overrides {
		s, err := o.v.render(md)
		if err != nil {
			return fail(o.path, err)
		}
		values[i] = strings.TrimSpace(s)
	}
	platform := md.Platform
	for i, o := range r.overrides {
		if err := o.ref.override(md, values[i]); err != nil {
			return fail(o.path, err)
		}
	}
	// The providerID Talos reports is in the format of its own platform. A rule
	// that moves the node to another platform without giving a providerID
	// drops it, so that talos-ccm builds the new platform's format from the
	// instance ID (or waits for one) instead of writing, once and for good, an
	// ID the new platform's CCM does not recognise.
	if md.Platform != platform && !r.setsProviderID {
		md.ProviderID = ""
	}
	res.Features.PublicIPDiscovery = res.Features.PublicIPDiscovery || r.features.PublicIPDiscovery
	return nil
}

// metadataSize is the total length of md's strings.
func metadataSize(md *Metadata) int {
	n := 0
	for _, f := range fields {
		n += len(f.get(md))
	}
	for k, v := range md.Tags {
		n += len(k) + len(v)
	}
	return n
}

// Owned returns the keys r produces, as enforce mode records them.
func (r *Result) Owned() OwnedKeys {
	o := OwnedKeys{Labels: sortedKeys(r.Labels), Annotations: sortedKeys(r.Annotations)}
	for _, t := range r.Taints {
		o.Taints = append(o.Taints, TaintID(t))
	}
	slices.Sort(o.Taints)
	return o
}

// Clone returns a deep copy of r.
func (r *Result) Clone() *Result {
	if r == nil {
		return nil
	}
	c := *r
	c.Metadata = r.Metadata.clone()
	c.Labels = maps.Clone(r.Labels)
	c.Annotations = maps.Clone(r.Annotations)
	c.Taints = slices.Clone(r.Taints)
	c.Matched = slices.Clone(r.Matched)
	c.Producible = r.Producible.clone()
	return &c
}
