// Package domain is what one native CCM owns: the nodes of a platform that
// carry given label values. A cloud CCM sees what its credentials and cloud
// config reach — one AWS or OpenStack region, one Hetzner project — and
// deletes every other node it is shown as "not found"; a domain is that
// boundary written as node labels.
//
// A domain is the platform plus, per label key, the set of values a node may
// carry (a conjunction of `key in (values)` requirements): what the view can
// select with a label selector and what the fence can check with its grant
// (coordinator/gate), nothing wider. The package decides membership, overlap
// and the split of one domain into one per boundary value; it reads no API
// and renders nothing.
package domain

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// Domain is the nodes of Platform whose labels carry, for every key of
// Require, one of its values. An empty Require is every node of the platform.
type Domain struct {
	Platform string
	// Require maps a label key to its allowed values, sorted, without
	// duplicates, never empty.
	Require map[string][]string
}

// MaxKeys bounds the label keys of one domain (the fence checks each).
const MaxKeys = 4

// MaxValues bounds the values of one key.
const MaxValues = 16

// FromSelector builds a domain from a NativeCCM's spec.domain.selector:
// matchLabels and matchExpressions with operator In, ANDed. platformLabel
// may not appear in it (the platform is spec.platform). Errors name the
// field.
func FromSelector(platform, platformLabel string, sel *metav1.LabelSelector) (Domain, error) {
	d := Domain{Platform: platform, Require: map[string][]string{}}
	if sel == nil {
		return d, nil
	}
	var errs []error
	narrow := func(field, key string, values []string) {
		if msgs := validation.IsQualifiedName(key); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: key %q: %s", field, key, strings.Join(msgs, "; ")))
			return
		}
		if key == platformLabel {
			errs = append(errs, fmt.Errorf("%s: %s is spec.platform's label; a domain narrows the platform by other labels", field, key))
			return
		}
		if len(values) == 0 {
			errs = append(errs, fmt.Errorf("%s: key %s: no values", field, key))
			return
		}
		for _, v := range values {
			if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 || v == "" {
				errs = append(errs, fmt.Errorf("%s: key %s: value %q is not a label value a node can carry", field, key, v))
				return
			}
		}
		set := sortedUnique(values)
		if have, ok := d.Require[key]; ok {
			set = intersect(have, set)
		}
		d.Require[key] = set
	}
	for _, k := range slices.Sorted(maps.Keys(sel.MatchLabels)) {
		narrow("matchLabels["+k+"]", k, []string{sel.MatchLabels[k]})
	}
	for i, e := range sel.MatchExpressions {
		field := fmt.Sprintf("matchExpressions[%d]", i)
		if e.Operator != metav1.LabelSelectorOpIn {
			errs = append(errs, fmt.Errorf("%s: operator %s: a domain may only use In (the fence enforces equality and set membership)", field, e.Operator))
			continue
		}
		narrow(field, e.Key, e.Values)
	}
	if err := errors.Join(errs...); err != nil {
		return Domain{}, err
	}
	for k, v := range d.Require {
		if len(v) == 0 {
			return Domain{}, fmt.Errorf("key %s: the requirements on it have no value in common, so the domain holds no node", k)
		}
		if len(v) > MaxValues {
			return Domain{}, fmt.Errorf("key %s: %d values, at most %d", k, len(v), MaxValues)
		}
	}
	if len(d.Require) > MaxKeys {
		return Domain{}, fmt.Errorf("%d label keys, at most %d", len(d.Require), MaxKeys)
	}
	return d, nil
}

// Whole reports whether the domain is every node of the platform.
func (d Domain) Whole() bool { return len(d.Require) == 0 }

// Keys are the label keys the domain restricts, sorted.
func (d Domain) Keys() []string { return slices.Sorted(maps.Keys(d.Require)) }

// Contains reports whether a node of the platform with these labels is in the
// domain. platformLabel's value must be the domain's platform.
func (d Domain) Contains(platformLabel string, labels map[string]string) bool {
	if labels[platformLabel] != d.Platform {
		return false
	}
	for k, vs := range d.Require {
		v, ok := labels[k]
		if !ok || !slices.Contains(vs, v) {
			return false
		}
	}
	return true
}

// Selector is the domain's label selector without the platform, as ccm-gate's
// --domain-selector takes it: "" for the whole platform.
func (d Domain) Selector() string {
	parts := make([]string, 0, len(d.Require))
	for _, k := range d.Keys() {
		parts = append(parts, k+" in ("+strings.Join(d.Require[k], ",")+")")
	}
	return strings.Join(parts, ",")
}

// String describes the domain for people: "aws nodes with
// topology.kubernetes.io/region in (eu-west-1)".
func (d Domain) String() string {
	if d.Whole() {
		return "every " + d.Platform + " node"
	}
	return d.Platform + " nodes with " + strings.ReplaceAll(d.Selector(), "),", ") and ")
}

// With narrows the domain to key=value (a split member's domain). ok is
// false when the domain excludes that value.
func (d Domain) With(key, value string) (Domain, bool) {
	if have, restricted := d.Require[key]; restricted && !slices.Contains(have, value) {
		return Domain{}, false
	}
	out := Domain{Platform: d.Platform, Require: maps.Clone(d.Require)}
	if out.Require == nil {
		out.Require = map[string][]string{}
	}
	out.Require[key] = []string{value}
	return out, true
}

// Overlap reports whether some node could be in both domains, and if so the
// labels of one such node (besides the platform label): for every key both
// restrict, a value they share; for keys one restricts, its first value.
func Overlap(a, b Domain) (map[string]string, bool) {
	if a.Platform != b.Platform {
		return nil, false
	}
	example := map[string]string{}
	for _, k := range sortedUnique(append(a.Keys(), b.Keys()...)) {
		av, aok := a.Require[k]
		bv, bok := b.Require[k]
		switch {
		case aok && bok:
			common := intersect(av, bv)
			if len(common) == 0 {
				return nil, false
			}
			example[k] = common[0]
		case aok:
			example[k] = av[0]
		default:
			example[k] = bv[0]
		}
	}
	return example, true
}

// BuiltinKeys are the domain label keys the fence and the coordinator know
// without configuration: v1.DomainLabel (set by a talos-ccm rule) and the
// region, the boundary of the aws and openstack profiles.
var BuiltinKeys = []string{v1.DomainLabel, "topology.kubernetes.io/region"}

// SplitSeparator joins a NativeCCM's release name and a member's slug:
// native-ccm-aws--eu-west-1. NativeCCM names may not contain it.
const SplitSeparator = "--"

func sortedUnique(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

func intersect(a, b []string) []string {
	var out []string
	for _, v := range a {
		if slices.Contains(b, v) {
			out = append(out, v)
		}
	}
	return out
}

// Of is the domain of a NativeCCM: spec.platform narrowed by
// spec.domain.selector, and the label its members are split by
// (spec.domain.splitBy, "" when it is not split). p is its profile: a split
// must be by the profile's boundary label, and the profile must know the
// cloud-config setting that takes the member's value. Errors name the field.
func Of(obj *v1.NativeCCM, p *profile.Profile) (d Domain, splitBy string, err error) {
	var sel *metav1.LabelSelector
	if obj.Spec.Domain != nil {
		sel, splitBy = obj.Spec.Domain.Selector, obj.Spec.Domain.SplitBy
	}
	if d, err = FromSelector(obj.Spec.Platform, names.PlatformLabel, sel); err != nil {
		return Domain{}, "", fmt.Errorf("spec.domain.selector: %w", err)
	}
	if splitBy == "" {
		return d, "", nil
	}
	if err := SplitByProfile(splitBy, p); err != nil {
		return Domain{}, "", err
	}
	if obj.LoadBalancersEnabled() {
		return Domain{}, "", fmt.Errorf("spec.domain.splitBy: a split NativeCCM serves no load balancers (its members' ServiceAccounts may change no Service); turn spec.loadBalancers off or give each %s a NativeCCM of its own", splitBy)
	}
	return d, splitBy, nil
}

// SplitByProfile checks spec.domain.splitBy against the profile: it must be
// the profile's boundary label, and the profile must say which cloud-config
// setting takes a member's value.
func SplitByProfile(splitBy string, p *profile.Profile) error {
	var boundary, setting string
	if p != nil && p.Domain != nil {
		boundary, setting = p.Domain.BoundaryLabel, p.Domain.CloudConfigRegion
	}
	name := "(none)"
	if p != nil {
		name = p.Name
	}
	switch {
	case boundary == "":
		return fmt.Errorf("spec.domain.splitBy %q: profile %s knows no boundary label (domain.boundaryLabel), so nothing says a CCM of the cloud sees one value of it; give each value a NativeCCM with spec.domain.selector instead", splitBy, name)
	case splitBy != boundary:
		return fmt.Errorf("spec.domain.splitBy %q: a NativeCCM of profile %s can only be split by its boundary label %s (domain.boundaryLabel)", splitBy, name, boundary)
	case setting == "":
		return fmt.Errorf("spec.domain.splitBy %q: profile %s does not say which cloud-config setting takes a member's %s (domain.cloudConfigRegion); give each value a NativeCCM with spec.domain.selector and its own cloud config instead", splitBy, name, boundary)
	}
	return nil
}

// ValidMember reports why value cannot name a split member of the NativeCCM
// name ("" when it can): the member's release native-ccm-<name>--<value>
// must be a Helm release name (a DNS label of at most 53 characters), and
// the fence reads the value back from its ServiceAccount's name.
func ValidMember(name, value string) string {
	if msgs := validation.IsDNS1123Label(value); len(msgs) > 0 {
		return strings.Join(msgs, "; ")
	}
	if strings.Contains(value, SplitSeparator) {
		return "it contains " + SplitSeparator
	}
	if n := len(v1.ReleasePrefix + name + SplitSeparator + value); n > MaxReleaseName {
		return fmt.Sprintf("the member's release name %s would be %d characters, Helm allows %d", v1.ReleasePrefix+name+SplitSeparator+value, n, MaxReleaseName)
	}
	return ""
}

// MaxReleaseName is Helm's limit on release names.
const MaxReleaseName = 53

// Keys are the label keys a NativeCCM's domain needs the fence to know:
// those its selector restricts and the split label.
func Keys(d Domain, splitBy string) []string {
	keys := d.Keys()
	if splitBy != "" && !slices.Contains(keys, splitBy) {
		keys = append(keys, splitBy)
		slices.Sort(keys)
	}
	return keys
}

// Unenforceable are the keys of Keys that the installed fence does not know.
func Unenforceable(d Domain, splitBy string, fenceKeys []string) []string {
	return slices.DeleteFunc(Keys(d, splitBy), func(k string) bool { return slices.Contains(fenceKeys, k) })
}
