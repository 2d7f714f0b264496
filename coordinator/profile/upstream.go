package profile

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/version"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// UpstreamSource says where the tag of the chosen upstream CCM came from.
type UpstreamSource string

const (
	// FromMinorTags: the profile's release for a Kubernetes minor (ccm.image.tags).
	FromMinorTags UpstreamSource = "Profile"
	// FromDefaultTag: the profile's one release for every minor (ccm.image.tag).
	FromDefaultTag UpstreamSource = "ProfileDefault"
	// FromOverride: the NativeCCM's spec.overrides.image.
	FromOverride UpstreamSource = "Override"
)

// MaxSkew is how many minors a CCM may be older than the API server
// (Kubernetes' version skew policy); it may never be newer.
const MaxSkew = 1

// Upstream is the upstream CCM release chosen for one API server.
type Upstream struct {
	// Repository and Tag of the image the CCM container runs.
	Repository, Tag string
	// Source of the tag.
	Source UpstreamSource
	// Minor is the Kubernetes minor the release is for (N of 1.N); 0 when
	// unknown (ccm.image.tag, or an overridden tag the profile does not list).
	Minor int
	// ServerMinor is the API server's minor the choice was made for.
	ServerMinor int
	// NodeFilterArgs are the flags that turn on the CCM's own node filter
	// (empty when the release has none, or filters by ForeignNodeLabels).
	NodeFilterArgs []string
	// ForeignNodeLabels are the labels other platforms' nodes need for this
	// release to leave them alone (empty when it has no such filter).
	ForeignNodeLabels map[string]string
}

// Reference is repository:tag.
func (u Upstream) Reference() string { return u.Repository + ":" + u.Tag }

// Skew is how many minors the release is older than the API server
// (negative: newer); ok is false when the release's minor is unknown.
func (u Upstream) Skew() (skew int, ok bool) {
	if u.Minor == 0 || u.ServerMinor == 0 {
		return 0, false
	}
	return u.ServerMinor - u.Minor, true
}

// SkewError says that a profile has no release an API server may run.
type SkewError struct {
	Profile     string
	ServerMinor int
	// Minors the profile has releases for, ascending.
	Minors []int
}

func (e *SkewError) Error() string {
	have := make([]string, len(e.Minors))
	for i, m := range e.Minors {
		have[i] = MinorString(m)
	}
	msg := fmt.Sprintf("profile %s has no upstream CCM release for Kubernetes %s or %s (ccm.image.tags has %s)",
		e.Profile, MinorString(e.ServerMinor), MinorString(e.ServerMinor-MaxSkew), strings.Join(have, ", "))
	if len(e.Minors) > 0 && e.Minors[0] > e.ServerMinor {
		msg += ": a CCM must not be newer than the API server"
	} else {
		msg += ": a CCM may be at most one minor older than the API server"
	}
	return msg + "; add a tag for " + MinorString(e.ServerMinor) + " (profile override ccm.image.tags) or set spec.overrides.image.tag"
}

// MinorString is "1.N".
func MinorString(minor int) string { return "1." + strconv.Itoa(minor) }

// ParseMinor reads a Kubernetes minor written 1.N (a key of ccm.image.tags).
func ParseMinor(s string) (int, error) {
	rest, ok := strings.CutPrefix(s, "1.")
	n, err := strconv.Atoi(rest)
	if !ok || err != nil || n < 0 || n > 999 || rest != strconv.Itoa(n) {
		return 0, fmt.Errorf("%q is not a Kubernetes minor written 1.N, e.g. 1.36", s)
	}
	return n, nil
}

// ServerMinor reads the minor of an API server's version (discovery's
// gitVersion, e.g. v1.36.3 or v1.36.3-gke.100).
func ServerMinor(gitVersion string) (int, error) {
	v, err := version.ParseGeneric(gitVersion)
	if err != nil {
		return 0, fmt.Errorf("API server version %q: %w", gitVersion, err)
	}
	if v.Major() != 1 {
		return 0, fmt.Errorf("API server version %q: not Kubernetes 1.x", gitVersion)
	}
	return int(v.Minor()), nil
}

// minors returns the minors of ccm.image.tags, ascending (keys are validated).
func (i Image) minors() []int {
	out := make([]int, 0, len(i.Tags))
	for k := range i.Tags {
		if m, err := ParseMinor(k); err == nil {
			out = append(out, m)
		}
	}
	sort.Ints(out)
	return out
}

// TagFor returns the profile's tag for an API server of the given minor and
// the release's minor (0: unknown): ccm.image.tag when set, else the
// release ccm.image.tags names for that minor, else the one a minor older.
// It fails with a *SkewError when there is none.
func (p *Profile) TagFor(serverMinor int) (tag string, minor int, err error) {
	img := p.CCM.Image
	if img.Tag != "" {
		return img.Tag, img.minorOf(img.Tag, serverMinor), nil
	}
	for m := serverMinor; m >= serverMinor-MaxSkew; m-- {
		if t, ok := img.Tags[MinorString(m)]; ok {
			return t, m, nil
		}
	}
	return "", 0, &SkewError{Profile: p.Name, ServerMinor: serverMinor, Minors: img.minors()}
}

// minorOf is the minor ccm.image.tags lists tag for (0: none): the newest
// one an API server of serverMinor may run, else the oldest.
func (i Image) minorOf(tag string, serverMinor int) int {
	minor := 0
	for _, m := range i.minors() {
		if i.Tags[MinorString(m)] == tag && (minor == 0 || m <= serverMinor) {
			minor = m
		}
	}
	return minor
}

// ChooseUpstream chooses the upstream CCM for an API server of the given
// minor, for a NativeCCM of platform whose spec.overrides.image names
// repository and/or tag ("" for none): an overridden tag wins; otherwise
// TagFor decides. The node filter is on when the chosen release has it.
func (p *Profile) ChooseUpstream(serverMinor int, platform, repository, tag string) (Upstream, error) {
	u := Upstream{Repository: p.CCM.Image.Repository, ServerMinor: serverMinor, Source: FromMinorTags}
	if tag != "" {
		u.Tag, u.Minor, u.Source = tag, p.CCM.Image.minorOf(tag, serverMinor), FromOverride
	} else {
		t, minor, err := p.TagFor(serverMinor)
		if err != nil {
			return Upstream{}, err
		}
		u.Tag, u.Minor = t, minor
		if p.CCM.Image.Tag != "" {
			u.Source = FromDefaultTag
		}
	}
	if repository != "" {
		u.Repository, u.Source = repository, FromOverride
	}
	if f := p.CCM.NodeFilter; f != nil && f.In(u.Tag) {
		if f.SelectorFlag != "" {
			u.NodeFilterArgs = []string{f.SelectorFlag + "=" + names.PlatformLabel + "=" + platform}
		}
		if len(f.ForeignNodeLabels) > 0 {
			u.ForeignNodeLabels = maps.Clone(f.ForeignNodeLabels)
		}
	}
	return u, nil
}

// In reports whether the release tagged tag has the filter (see Since).
func (f *NodeFilter) In(tag string) bool {
	v, err := releaseVersion(tag)
	if err != nil {
		return false
	}
	newerThanAll := true
	for _, s := range f.Since {
		sv, err := releaseVersion(s)
		if err != nil {
			continue
		}
		switch {
		case sameLine(v, sv):
			return v.AtLeast(sv)
		case !lineNewer(v, sv):
			newerThanAll = false
		}
	}
	return newerThanAll && len(f.Since) > 0
}

// releaseVersion reads a release tag: v1.34.0, 35.1.2, v1.33.0-rc.0.
func releaseVersion(tag string) (*version.Version, error) {
	return version.ParseSemantic(strings.TrimPrefix(tag, "v"))
}

func sameLine(a, b *version.Version) bool { return a.Major() == b.Major() && a.Minor() == b.Minor() }

func lineNewer(a, b *version.Version) bool {
	return a.Major() > b.Major() || (a.Major() == b.Major() && a.Minor() > b.Minor())
}

// tagRE is what an OCI registry accepts as a tag.
var tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// flagRE is a long flag's name.
var flagRE = regexp.MustCompile(`^--[a-z0-9][-a-z0-9]*$`)

// validateImage checks ccm.image: a repository and a tag, or tags per minor.
func validateImage(fp *field.Path, img Image) field.ErrorList {
	var errs field.ErrorList
	if img.Repository == "" {
		errs = append(errs, field.Required(fp.Child("repository"), ""))
	}
	if img.Tag == "" && len(img.Tags) == 0 {
		errs = append(errs, field.Required(fp.Child("tag"), "pin a version: tag (one release for every Kubernetes minor) or tags (one per minor, keyed 1.N)"))
	}
	if img.Tag != "" && !tagRE.MatchString(img.Tag) {
		errs = append(errs, field.Invalid(fp.Child("tag"), img.Tag, "not an image tag (letters, digits, '_', '.', '-'; at most 128)"))
	}
	for _, k := range slices.Sorted(maps.Keys(img.Tags)) {
		kp := fp.Child("tags").Key(k)
		if _, err := ParseMinor(k); err != nil {
			errs = append(errs, field.Invalid(kp, k, err.Error()))
		}
		if t := img.Tags[k]; !tagRE.MatchString(t) {
			errs = append(errs, field.Invalid(kp, t, "not an image tag (letters, digits, '_', '.', '-'; at most 128)"))
		}
	}
	return errs
}

// validateNodeFilter checks ccm.nodeFilter.
func validateNodeFilter(fp *field.Path, c *CCM) field.ErrorList {
	f := c.NodeFilter
	if f == nil {
		return nil
	}
	var errs field.ErrorList
	if f.SelectorFlag == "" && len(f.ForeignNodeLabels) == 0 {
		errs = append(errs, field.Required(fp, "selectorFlag or foreignNodeLabels: how the CCM leaves other platforms' nodes alone"))
	}
	if f.SelectorFlag != "" {
		sp := fp.Child("selectorFlag")
		switch {
		case !flagRE.MatchString(f.SelectorFlag):
			errs = append(errs, field.Invalid(sp, f.SelectorFlag, "a flag name such as --node-filter-requirements (the coordinator adds =<selector>)"))
		case slices.Contains(EnforcedFlags, f.SelectorFlag):
			errs = append(errs, field.Forbidden(sp, f.SelectorFlag+" is set by the coordinator"))
		}
		for i, a := range c.Args {
			if FlagName(a) == f.SelectorFlag {
				errs = append(errs, field.Invalid(fp.Root().Child("ccm", "args").Index(i), a, "set by ccm.nodeFilter.selectorFlag"))
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(f.ForeignNodeLabels)) {
		kp := fp.Child("foreignNodeLabels").Key(k)
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(kp, k, msg))
		}
		if k == names.PlatformLabel {
			errs = append(errs, field.Forbidden(kp, "the routing label is talos-ccm's"))
		}
		for _, msg := range validation.IsValidLabelValue(f.ForeignNodeLabels[k]) {
			errs = append(errs, field.Invalid(kp, f.ForeignNodeLabels[k], msg))
		}
	}
	if len(f.Since) == 0 {
		errs = append(errs, field.Required(fp.Child("since"), "the first release with the filter, one per release line"))
	}
	lines := map[string]bool{}
	for i, s := range f.Since {
		v, err := releaseVersion(s)
		if err != nil {
			errs = append(errs, field.Invalid(fp.Child("since").Index(i), s, "a release tag such as v1.34.0"))
			continue
		}
		line := fmt.Sprintf("%d.%d", v.Major(), v.Minor())
		if lines[line] {
			errs = append(errs, field.Duplicate(fp.Child("since").Index(i), "release line "+line))
		}
		lines[line] = true
	}
	return errs
}

// NewestMinor is the newest minor ccm.image.tags has a release for; 0 when
// it has none (ccm.image.tag serves every minor).
func (p *Profile) NewestMinor() int {
	m := p.CCM.Image.minors()
	if len(m) == 0 {
		return 0
	}
	return m[len(m)-1]
}
