package profile

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// tagged is a profile with releases for 1.34 to 1.36 and Azure's node filter.
func tagged(defaultTag string) *Profile {
	return &Profile{Name: "azure", CCM: CCM{
		Image: Image{Repository: "mcr/azure-ccm", Tag: defaultTag,
			Tags: map[string]string{"1.34": "v1.34.13", "1.35": "v1.35.8", "1.36": "v1.36.5"}},
		NodeFilter: &NodeFilter{SelectorFlag: "--node-filter-requirements", Since: []string{"v1.33.3", "v1.34.0"}},
	}}
}

func TestChooseUpstream(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    *Profile
		// server is the API server's minor; repo and tag the NativeCCM's image override.
		server    int
		repo, tag string
		// want is the image, source, release minor (0: unknown) and skew (when known).
		want      string
		source    UpstreamSource
		minor     int
		skew      int
		skewKnown bool
		// filter: the CCM gets the node filter flag
		filter bool
		// err is in the refusal's message; "" for none.
		err string
	}{
		{name: "the release for the API server's minor", p: tagged(""), server: 36,
			want: "mcr/azure-ccm:v1.36.5", source: FromMinorTags, minor: 36, skewKnown: true, filter: true},
		{name: "none for the minor: the one a minor older", p: tagged(""), server: 37,
			want: "mcr/azure-ccm:v1.36.5", source: FromMinorTags, minor: 36, skew: 1, skewKnown: true, filter: true},
		{name: "two minors newer than every release: refused", p: tagged(""), server: 38,
			err: "profile azure has no upstream CCM release for Kubernetes 1.38 or 1.37 (ccm.image.tags has 1.34, 1.35, 1.36): a CCM may be at most one minor older"},
		{name: "older than every release: refused", p: tagged(""), server: 33,
			err: "a CCM must not be newer than the API server; add a tag for 1.33"},
		{name: "the one tag pins every minor, even outside the skew policy", p: tagged("v1.33.2"), server: 38,
			want: "mcr/azure-ccm:v1.33.2", source: FromDefaultTag},
		{name: "the one tag wins over tags and has the minor tags list it for", p: tagged("v1.35.8"), server: 36,
			want: "mcr/azure-ccm:v1.35.8", source: FromDefaultTag, minor: 35, skew: 1, skewKnown: true, filter: true},
		{name: "an overridden tag the profile names for a minor", p: tagged(""), server: 36, tag: "v1.35.8",
			want: "mcr/azure-ccm:v1.35.8", source: FromOverride, minor: 35, skew: 1, skewKnown: true, filter: true},
		{name: "an overridden tag the profile does not name, without the filter", p: tagged(""), server: 36, tag: "v1.33.2",
			want: "mcr/azure-ccm:v1.33.2", source: FromOverride},
		{name: "an overridden tag that is no version: no filter", p: tagged(""), server: 36, tag: "latest",
			want: "mcr/azure-ccm:latest", source: FromOverride},
		{name: "an overridden tag allowed even outside the skew policy", p: tagged(""), server: 38, tag: "v1.34.13",
			want: "mcr/azure-ccm:v1.34.13", source: FromOverride, minor: 34, skew: 4, skewKnown: true, filter: true},
		{name: "an overridden repository keeps the chosen tag", p: tagged(""), server: 35, repo: "mirror.example/azure-ccm",
			want: "mirror.example/azure-ccm:v1.35.8", source: FromOverride, minor: 35, skewKnown: true, filter: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := tc.p.ChooseUpstream(tc.server, "azure", tc.repo, tc.tag)
			if tc.err != "" {
				var skew *SkewError
				if !errors.As(err, &skew) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want a *SkewError saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			skew, known := u.Skew()
			if u.Reference() != tc.want || u.Source != tc.source || u.Minor != tc.minor || known != tc.skewKnown || skew != tc.skew {
				t.Errorf("chose %s (%s, minor %d, skew %d known %v), want %s (%s, minor %d, skew %d known %v)",
					u.Reference(), u.Source, u.Minor, skew, known, tc.want, tc.source, tc.minor, tc.skew, tc.skewKnown)
			}
			wantArgs := []string(nil)
			if tc.filter {
				wantArgs = []string{"--node-filter-requirements=node.cloudprovider.kubernetes.io/platform=azure"}
			}
			if !slices.Equal(u.NodeFilterArgs, wantArgs) {
				t.Errorf("node filter args %q, want %q", u.NodeFilterArgs, wantArgs)
			}
		})
	}
}

func TestNodeFilterIn(t *testing.T) {
	azure := &NodeFilter{Since: []string{"v1.30.15", "v1.31.9", "v1.32.8", "v1.33.3", "v1.34.0"}}
	gcp := &NodeFilter{Since: []string{"v35.1.2", "v36.0.1"}}
	for _, tc := range []struct {
		f    *NodeFilter
		tag  string
		want bool
	}{
		{azure, "v1.33.2", false},     // the line's entry is later
		{azure, "v1.33.3", true},      // the line's entry
		{azure, "v1.36.5", true},      // a line newer than every entry
		{azure, "v1.37.0-rc.0", true}, // a pre-release of a newer line
		{azure, "v1.29.9", false},     // a line older than every entry
		{azure, "latest", false},      // not a version
		{azure, "", false},
		{gcp, "v34.2.0", false},
		{gcp, "v35.1.1", false},
		{gcp, "v35.1.3", true},
		{gcp, "v35.0.9", false}, // a line between entries without one of its own
		{gcp, "v36.0.0", false},
		{gcp, "v36.3.8", true},
		{gcp, "37.0.0", true},
		{&NodeFilter{}, "v1.36.0", false}, // no entries: no release has it
	} {
		if got := tc.f.In(tc.tag); got != tc.want {
			t.Errorf("%v.In(%q) = %v, want %v", tc.f.Since, tc.tag, got, tc.want)
		}
	}
}

// The built-in profiles: Azure's CCM filters by the platform label from
// every release they name; GCP's leaves labelled nodes alone from v35.1.2,
// so its 1.34 release has no filter; every per-minor profile names 1.34-1.36.
func TestBuiltinUpstreams(t *testing.T) {
	set, err := Builtin()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		profile string
		server  int
		want    string
		args    []string
		labels  map[string]string
	}{
		{"azure", 36, "mcr.microsoft.com/oss/kubernetes/azure-cloud-controller-manager:v1.36.5",
			[]string{"--node-filter-requirements=node.cloudprovider.kubernetes.io/platform=azure"}, nil},
		{"azure", 37, "mcr.microsoft.com/oss/kubernetes/azure-cloud-controller-manager:v1.36.5",
			[]string{"--node-filter-requirements=node.cloudprovider.kubernetes.io/platform=azure"}, nil},
		{"gcp", 36, "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v36.3.8", nil,
			map[string]string{"components.gke.io/gke-unmanaged-node": "true"}},
		{"gcp", 37, "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v36.3.8", nil,
			map[string]string{"components.gke.io/gke-unmanaged-node": "true"}},
		{"aws", 36, "registry.k8s.io/provider-aws/cloud-controller-manager:v1.36.2", nil, nil},
		{"aws", 37, "registry.k8s.io/provider-aws/cloud-controller-manager:v1.37.1", nil, nil},
		{"openstack", 37, "registry.k8s.io/provider-os/openstack-cloud-controller-manager:v1.36.0", nil, nil},
		{"scaleway", 36, "docker.io/scaleway/scaleway-cloud-controller-manager:v0.30.5", nil,
			map[string]string{"k8s.scw.cloud/disable-lifecycle": "true"}},
	} {
		p, _ := set.Get(tc.profile)
		u, err := p.ChooseUpstream(tc.server, tc.profile, "", "")
		if err != nil {
			t.Errorf("%s at 1.%d: %v", tc.profile, tc.server, err)
			continue
		}
		if u.Reference() != tc.want || !slices.Equal(u.NodeFilterArgs, tc.args) || !maps.Equal(u.ForeignNodeLabels, tc.labels) {
			t.Errorf("%s at 1.%d: %s %q %v, want %s %q %v", tc.profile, tc.server, u.Reference(), u.NodeFilterArgs, u.ForeignNodeLabels, tc.want, tc.args, tc.labels)
		}
	}
	// Every minor of the supported range up to the newest these four have
	// (the oldest is OLDEST_KUBE_VERSION in hack/lib/versions.sh).
	versions, err := os.ReadFile(filepath.Join("..", "..", "hack", "lib", "versions.sh"))
	if err != nil {
		t.Fatal(err)
	}
	oldest := regexp.MustCompile(`OLDEST_KUBE_VERSION:-1\.(\d+)\.`).FindSubmatch(versions)
	if oldest == nil {
		t.Fatal("hack/lib/versions.sh sets no OLDEST_KUBE_VERSION default")
	}
	from, _ := strconv.Atoi(string(oldest[1]))
	for _, name := range []string{"aws", "azure", "gcp", "openstack"} {
		p, _ := set.Get(name)
		for m := from; m <= 36; m++ {
			if _, ok := p.CCM.Image.Tags[MinorString(m)]; !ok {
				t.Errorf("profile %s names no release for Kubernetes 1.%d", name, m)
			}
		}
	}
}

func TestServerMinor(t *testing.T) {
	for in, want := range map[string]int{"v1.36.3": 36, "v1.34.4-gke.1200": 34, "1.37.0": 37} {
		if got, err := ServerMinor(in); err != nil || got != want {
			t.Errorf("ServerMinor(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "v2.0.0", "banana"} {
		if _, err := ServerMinor(in); err == nil {
			t.Errorf("ServerMinor(%q) took it", in)
		}
	}
}
