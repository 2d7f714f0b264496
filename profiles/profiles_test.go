package profiles_test

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/facts"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// The profiles repeat facts that talos-ccm's code owns (the providerIDs it
// writes) and docs/profiles.md repeats the profiles. These tests fail when a
// profile is added or changed and the other side is forgotten.

// talosProviderIDs are, for the platforms whose providerID talos-ccm takes
// only from the node's Talos metadata (it cannot build it from an instance
// ID), a providerID in the format Talos's platform code reports.
var talosProviderIDs = map[string]string{
	"azure": "azure:///subscriptions/5c2a0f16-0000-4000-8000-000000000001/resourceGroups/Hybrid-RG/providers/Microsoft.Compute/virtualMachines/vm-1",
	"gcp":   "gce://hybrid-project/europe-west4-a/gcp-1",
}

// instanceID is the node's instance ID in the metadata the test gives
// talos-ccm: a UUID, which every platform's builder accepts (cloudscale
// takes nothing else).
const instanceID = "3f2b8c1e-4d5a-4b6c-9e7f-0a1b2c3d4e5f"

// TestProviderIDPrefixesMatchTalosCCM: for every platform a built-in profile
// routes, the providerID talos-ccm writes on such a node starts with one of
// the profile's providerIDPrefixes. The fence lets a native CCM delete only
// nodes with such a prefix, so a mismatch would leave the CCM unable to
// remove its own gone nodes; a platform without a providerID builder gets
// talos://<platform>/<ip>, which no native CCM understands.
func TestProviderIDPrefixesMatchTalosCCM(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	routed := map[string]bool{}
	for _, name := range set.Names() {
		p, _ := set.Get(name)
		for _, platform := range p.Platforms {
			routed[platform] = true
			t.Run(name+"/"+platform, func(t *testing.T) {
				md := &cloud.Metadata{Platform: platform, Region: "region-1", Zone: "zone-1a", InstanceID: instanceID}
				from := "built from the instance ID"
				id, err := cloud.ProviderID(md, "192.0.2.10")
				if errors.Is(err, facts.ErrMetadataIncomplete) {
					sample, ok := talosProviderIDs[platform]
					if !ok {
						t.Fatalf("talos-ccm builds no providerID for platform %s from its metadata (%v); if it takes it only from Talos's metadata, add the format Talos reports to talosProviderIDs", platform, err)
					}
					md.ProviderID = sample
					from = "Talos's metadata " + sample
					id, err = cloud.ProviderID(md, "192.0.2.10")
				}
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(id, "talos://") {
					from = "talos-ccm's fallback: ccm/cloud has no providerID format for the platform"
				}
				if !slices.ContainsFunc(p.ProviderIDPrefixes, func(prefix string) bool { return strings.HasPrefix(id, prefix) }) {
					t.Errorf("talos-ccm writes providerID %q (%s) on a node of platform %s, which profile %s (%s) routes, but its providerIDPrefixes are %q: the fence would deny its CCM that node",
						id, from, platform, name, set.File(name), p.ProviderIDPrefixes)
				}
			})
		}
	}
	for platform := range talosProviderIDs {
		if !routed[platform] {
			t.Errorf("talosProviderIDs has %s, which no built-in profile routes: remove it", platform)
		}
	}
}

// TestDocumentedProfilesAreTheBuiltinOnes: the table of built-in profiles in
// docs/profiles.md has one row per profile, with its platforms and
// providerID prefixes.
func TestDocumentedProfilesAreTheBuiltinOnes(t *testing.T) {
	checkDocTable(t, "profiles.md", "| profile | routes platform | providerID prefixes |", func(p *profile.Profile) map[string][]string {
		return map[string][]string{"routes platform": p.Platforms, "providerID prefixes": p.ProviderIDPrefixes}
	})
}

// TestDocumentedLoadBalancersAreTheProfiles: the table in
// docs/load-balancers.md has one row per built-in profile with its service
// controller, the env it sets while load balancers are on and the
// cloud-config settings the controller reads.
func TestDocumentedLoadBalancersAreTheProfiles(t *testing.T) {
	checkDocTable(t, "load-balancers.md", "| profile | controller | env while on | cloud-config settings | notes |", func(p *profile.Profile) map[string][]string {
		var controller, env, settings []string
		if lb := p.LoadBalancers; lb != nil && lb.Unsupported == "" {
			controller = []string{lb.Controller}
			for _, e := range lb.Env {
				env = append(env, e.Name+"="+e.Value)
			}
			settings = lb.CloudConfig
		}
		return map[string][]string{"controller": controller, "env while on": env, "cloud-config settings": settings}
	})
}

// TestDocumentedReleasesAreTheProfiles: the table of upstream releases in
// docs/profiles.md has one row per built-in profile with its release per
// Kubernetes minor (any: for its one tag) and its own node filter.
func TestDocumentedReleasesAreTheProfiles(t *testing.T) {
	checkDocTable(t, "profiles.md", "| profile | releases | node filter | node filter since |", func(p *profile.Profile) map[string][]string {
		var releases, filter, since []string
		for _, k := range slices.Sorted(maps.Keys(p.CCM.Image.Tags)) {
			releases = append(releases, k+": "+p.CCM.Image.Tags[k])
		}
		if p.CCM.Image.Tag != "" {
			releases = append(releases, "any: "+p.CCM.Image.Tag)
		}
		if f := p.CCM.NodeFilter; f != nil {
			if f.SelectorFlag != "" {
				filter = append(filter, f.SelectorFlag)
			}
			for _, k := range slices.Sorted(maps.Keys(f.ForeignNodeLabels)) {
				filter = append(filter, k+"="+f.ForeignNodeLabels[k])
			}
			since = f.Since
		}
		return map[string][]string{"releases": releases, "node filter": filter, "node filter since": since}
	})
}

// checkDocTable reads the table of docs/<doc> that starts with header: one
// row per built-in profile, named in its first column, and in the columns
// after it the `code` spans want returns for the profile, by the column's
// header.
func checkDocTable(t *testing.T, doc, header string, want func(*profile.Profile) map[string][]string) {
	t.Helper()
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("..", "docs", doc))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "\n"+header)
	if !ok {
		t.Fatalf("docs/%s has no table starting %q", doc, header)
	}
	columns := strings.Split(strings.Trim(header, "| "), " | ")
	code := regexp.MustCompile("`([^`]+)`")
	documented := map[string]bool{}
	for i, line := range strings.Split(table, "\n") {
		if i == 0 {
			continue // the rest of the header line
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		col := strings.Split(line, "|")
		if len(col) < len(columns)+2 || strings.HasPrefix(strings.TrimSpace(col[1]), "---") {
			continue
		}
		name := strings.TrimSpace(col[1])
		documented[name] = true
		p, ok := set.Get(name)
		if !ok {
			t.Errorf("docs/%s documents profile %s, which is not built in", doc, name)
			continue
		}
		for column, values := range want(p) {
			k := slices.Index(columns, column)
			if k < 0 {
				t.Fatalf("docs/%s: the table has no column %q", doc, column)
			}
			var got []string
			for _, m := range code.FindAllStringSubmatch(col[k+1], -1) {
				got = append(got, m[1])
			}
			if !slices.Equal(got, values) {
				t.Errorf("docs/%s: %s has %s %q, profile %s (%s) %q", doc, name, column, got, name, set.File(name), values)
			}
		}
	}
	for _, name := range set.Names() {
		if !documented[name] {
			t.Errorf("profile %s (%s) is built in, the table of docs/%s does not list it", name, set.File(name), doc)
		}
	}
}
