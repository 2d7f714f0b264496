package domain

import (
	"maps"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

const (
	platformLabel = names.PlatformLabel
	region        = "topology.kubernetes.io/region"
	account       = v1.DomainLabel
)

func in(key string, values ...string) metav1.LabelSelectorRequirement {
	return metav1.LabelSelectorRequirement{Key: key, Operator: metav1.LabelSelectorOpIn, Values: values}
}

func TestFromSelector(t *testing.T) {
	tests := []struct {
		name string
		sel  *metav1.LabelSelector
		// selector is the view's selector; err a part of the error.
		selector, err string
	}{
		{name: "none is the whole platform", sel: nil, selector: ""},
		{name: "empty is the whole platform", sel: &metav1.LabelSelector{}, selector: ""},
		{name: "matchLabels", sel: &metav1.LabelSelector{MatchLabels: map[string]string{region: "eu-west-1"}}, selector: region + " in (eu-west-1)"},
		{name: "In, values sorted and unique", sel: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{in(region, "b", "a", "b")}}, selector: region + " in (a,b)"},
		{name: "requirements on one key intersect", sel: &metav1.LabelSelector{
			MatchLabels:      map[string]string{region: "a"},
			MatchExpressions: []metav1.LabelSelectorRequirement{in(region, "a", "b")},
		}, selector: region + " in (a)"},
		{name: "two keys", sel: &metav1.LabelSelector{MatchLabels: map[string]string{region: "a", account: "p1"}}, selector: account + " in (p1)," + region + " in (a)"},
		{name: "disjoint requirements hold no node", sel: &metav1.LabelSelector{
			MatchLabels:      map[string]string{region: "a"},
			MatchExpressions: []metav1.LabelSelectorRequirement{in(region, "b")},
		}, err: "no value in common"},
		{name: "NotIn is refused", sel: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: region, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"a"}}}}, err: "matchExpressions[0]: operator NotIn"},
		{name: "Exists is refused", sel: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: region, Operator: metav1.LabelSelectorOpExists}}}, err: "operator Exists"},
		{name: "the platform label is refused", sel: &metav1.LabelSelector{MatchLabels: map[string]string{platformLabel: "hcloud"}}, err: "spec.platform's label"},
		{name: "empty value is refused", sel: &metav1.LabelSelector{MatchLabels: map[string]string{region: ""}}, err: "not a label value"},
		{name: "bad key", sel: &metav1.LabelSelector{MatchLabels: map[string]string{"a b": "x"}}, err: `key "a b"`},
		{name: "In without values", sel: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{in(region)}}, err: "no values"},
		{name: "too many keys", sel: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "1", "b": "1", "c": "1", "d": "1", "e": "1"}}, err: "at most 4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := FromSelector("aws", platformLabel, tc.sel)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Selector(); got != tc.selector {
				t.Fatalf("selector %q, want %q", got, tc.selector)
			}
		})
	}
}

func TestContains(t *testing.T) {
	d, err := FromSelector("aws", platformLabel, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{in(region, "eu-west-1", "eu-central-1")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{platformLabel: "aws", region: "eu-west-1"}, true},
		{map[string]string{platformLabel: "aws", region: "eu-central-1", "x": "y"}, true},
		{map[string]string{platformLabel: "aws", region: "us-east-1"}, false},
		{map[string]string{platformLabel: "aws"}, false},
		{map[string]string{platformLabel: "hcloud", region: "eu-west-1"}, false},
		{map[string]string{region: "eu-west-1"}, false},
	} {
		if got := d.Contains(platformLabel, tc.labels); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.labels, got, tc.want)
		}
	}
	whole := Domain{Platform: "aws"}
	if !whole.Contains(platformLabel, map[string]string{platformLabel: "aws"}) || whole.Contains(platformLabel, map[string]string{}) {
		t.Error("the whole platform's domain")
	}
}

func TestOverlap(t *testing.T) {
	mk := func(req map[string][]string) Domain { return Domain{Platform: "aws", Require: req} }
	for _, tc := range []struct {
		name    string
		a, b    Domain
		overlap bool
		example map[string]string
	}{
		{"disjoint regions", mk(map[string][]string{region: {"a"}}), mk(map[string][]string{region: {"b"}}), false, nil},
		{"shared region", mk(map[string][]string{region: {"a", "b"}}), mk(map[string][]string{region: {"b", "c"}}), true, map[string]string{region: "b"}},
		{"whole platform overlaps any", mk(nil), mk(map[string][]string{region: {"a"}}), true, map[string]string{region: "a"}},
		{"different keys overlap", mk(map[string][]string{region: {"a"}}), mk(map[string][]string{account: {"p"}}), true, map[string]string{region: "a", account: "p"}},
		{"one key disjoint is enough", mk(map[string][]string{region: {"a"}, account: {"p"}}), mk(map[string][]string{region: {"b"}, account: {"p"}}), false, nil},
		{"other platform", mk(nil), Domain{Platform: "hcloud"}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex, ok := Overlap(tc.a, tc.b)
			if ok != tc.overlap || (ok && !maps.Equal(ex, tc.example)) {
				t.Fatalf("Overlap = %v %v, want %v %v", ex, ok, tc.overlap, tc.example)
			}
			if ex2, ok2 := Overlap(tc.b, tc.a); ok2 != ok || (ok && !maps.Equal(ex, ex2)) {
				t.Fatalf("not symmetric: %v %v", ex2, ok2)
			}
			if ok {
				l := maps.Clone(ex)
				l[platformLabel] = tc.a.Platform
				if !tc.a.Contains(platformLabel, l) || !tc.b.Contains(platformLabel, l) {
					t.Fatalf("example %v is not in both", ex)
				}
			}
		})
	}
}

func TestWith(t *testing.T) {
	d := Domain{Platform: "aws", Require: map[string][]string{region: {"a", "b"}}}
	if m, ok := d.With(region, "a"); !ok || m.Selector() != region+" in (a)" {
		t.Fatalf("With a: %v %v", m, ok)
	}
	if _, ok := d.With(region, "c"); ok {
		t.Fatal("With c: a value the domain excludes")
	}
	if d.Require[region][0] != "a" || len(d.Require[region]) != 2 {
		t.Fatal("With changed the domain")
	}
	if m, ok := (Domain{Platform: "openstack"}).With(region, "RegionOne"); !ok || m.Require[region][0] != "RegionOne" {
		t.Fatalf("With on the whole platform: %v", m)
	}
}

// TestOf: spec.domain.splitBy is the split label when it is the profile's
// boundary label and the profile knows the cloud-config setting for it;
// anything else is refused naming the field.
func TestOf(t *testing.T) {
	aws := &profile.Profile{Name: "aws", Domain: &profile.Domain{BoundaryLabel: region, CloudConfigRegion: "Global.Region"}}
	noSetting := &profile.Profile{Name: "os", Domain: &profile.Domain{BoundaryLabel: region}}
	noBoundary := &profile.Profile{Name: "hcloud"}
	ccm := func(splitBy string, lb bool) *v1.NativeCCM {
		n := &v1.NativeCCM{Spec: v1.NativeCCMSpec{Platform: "aws", Domain: &v1.Domain{SplitBy: splitBy,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{account: "a1"}}}}}
		n.Name = "aws"
		if lb {
			n.Spec.LoadBalancers = &v1.LoadBalancers{Enabled: true}
		}
		return n
	}
	for _, tc := range []struct {
		name string
		obj  *v1.NativeCCM
		p    *profile.Profile
		// splitBy is what Of returns; want, when set, its error's words.
		splitBy string
		want    []string
	}{
		{name: "not split", obj: ccm("", false), p: noBoundary},
		{name: "split by the boundary", obj: ccm(region, false), p: aws, splitBy: region},
		{name: "another label", obj: ccm(account, false), p: aws, want: []string{"spec.domain.splitBy", account, "only be split by its boundary label " + region}},
		{name: "no boundary", obj: ccm(region, false), p: noBoundary, want: []string{"spec.domain.splitBy", "profile hcloud knows no boundary label"}},
		{name: "no cloud-config setting", obj: ccm(region, false), p: noSetting, want: []string{"spec.domain.splitBy", "domain.cloudConfigRegion"}},
		{name: "load balancers", obj: ccm(region, true), p: aws, want: []string{"spec.domain.splitBy", "serves no load balancers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, splitBy, err := Of(tc.obj, tc.p)
			if len(tc.want) > 0 {
				if err == nil {
					t.Fatalf("got split %q, want an error with %q", splitBy, tc.want)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			if err != nil || splitBy != tc.splitBy || d.Selector() != account+" in (a1)" {
				t.Fatalf("got %v, %q, %v; want the selector and split %q", d, splitBy, err, tc.splitBy)
			}
		})
	}
}

// TestValidMember: a value names a member when native-ccm-<name>--<value>
// is a Helm release name.
func TestValidMember(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		ok          bool
	}{
		{"aws", "eu-west-1", true},
		{"aws", "EU_West", false},
		{"aws", "a.b", false},
		{"aws", "", false},
		{"aws", strings.Repeat("r", 37), true}, // native-ccm-aws-- is 16 of the 53
		{"aws", strings.Repeat("r", 38), false},
	} {
		if why := ValidMember(tc.name, tc.value); (why == "") != tc.ok {
			t.Errorf("ValidMember(%q, %q) = %q, want ok %v", tc.name, tc.value, why, tc.ok)
		}
	}
}
