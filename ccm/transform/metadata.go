package transform

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Metadata is what a rule matches on and templates over: the fields of the
// Talos runtime/PlatformMetadata resource plus those of hardware/SystemInformation.
// The JSON names are the Talos resource YAML keys.
type Metadata struct {
	Platform     string `json:"platform,omitempty"`
	Hostname     string `json:"hostname,omitempty"`
	Region       string `json:"region,omitempty"`
	Zone         string `json:"zone,omitempty"`
	InstanceType string `json:"instanceType,omitempty"`
	InstanceID   string `json:"instanceId,omitempty"`
	ProviderID   string `json:"providerId,omitempty"`
	Spot         bool   `json:"spot,omitempty"`
	InternalDNS  string `json:"internalDNS,omitempty"`
	ExternalDNS  string `json:"externalDNS,omitempty"`

	Tags map[string]string `json:"tags,omitempty"`

	// SystemInformation (hardware/SystemInformation); read from the Talos API
	// only when NeedsSystemInformation reports that a rule uses it.
	Manufacturer string `json:"manufacturer,omitempty"`
	ProductName  string `json:"productName,omitempty"`
	Version      string `json:"version,omitempty"`
	SerialNumber string `json:"serialNumber,omitempty"`
	UUID         string `json:"uuid,omitempty"`
	SKUNumber    string `json:"skuNumber,omitempty"`
}

// clone returns a copy that shares no map with m.
func (m Metadata) clone() Metadata {
	if m.Tags != nil {
		m.Tags = maps.Clone(m.Tags)
	}
	return m
}

// field describes one metadata field that selectors and platformMetadata
// overrides refer to by a case-insensitive key.
type field struct {
	key    string // documented spelling, e.g. "instanceID"
	goName string // Metadata field name, as templates spell it
	system bool   // a SystemInformation field
	get    func(*Metadata) string
	assign func(*Metadata, string) error
	// overridable: rules may set it with platformMetadata.
	overridable bool
	// always: the field is present even when empty (booleans).
	always bool
	// checkOverride, if set, vets a value platformMetadata renders for it.
	checkOverride func(string) error
}

func stringField(key, goName string, system bool, p func(*Metadata) *string, overridable bool) field {
	return field{
		key: key, goName: goName, system: system, overridable: overridable,
		get:    func(m *Metadata) string { return *p(m) },
		assign: func(m *Metadata, v string) error { *p(m) = v; return nil },
	}
}

// platformField is the Talos platform. Rules may override it, for machines
// whose Talos platform is not the cloud they run in (a nocloud image on
// OpenStack, say): it becomes the routing label, so it must stay a non-empty
// label value.
func platformField() field {
	f := stringField("platform", "Platform", false, func(m *Metadata) *string { return &m.Platform }, true)
	f.checkOverride = func(v string) error {
		if v == "" {
			return errors.New("platform must not be empty")
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			return fmt.Errorf("platform %q is not a valid label value: %s", v, strings.Join(msgs, "; "))
		}
		return nil
	}
	return f
}

// fields lists every matchable field in documentation order.
var fields = []field{
	platformField(),
	stringField("hostname", "Hostname", false, func(m *Metadata) *string { return &m.Hostname }, false),
	stringField("region", "Region", false, func(m *Metadata) *string { return &m.Region }, true),
	stringField("zone", "Zone", false, func(m *Metadata) *string { return &m.Zone }, true),
	stringField("instanceType", "InstanceType", false, func(m *Metadata) *string { return &m.InstanceType }, true),
	stringField("instanceID", "InstanceID", false, func(m *Metadata) *string { return &m.InstanceID }, true),
	stringField("providerID", "ProviderID", false, func(m *Metadata) *string { return &m.ProviderID }, true),
	{
		key: "spot", goName: "Spot", always: true, overridable: true,
		get: func(m *Metadata) string { return strconv.FormatBool(m.Spot) },
		assign: func(m *Metadata, v string) error {
			if v == "" {
				m.Spot = false
				return nil
			}
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("spot must render to true or false, got %q", v)
			}
			m.Spot = b
			return nil
		},
	},
	stringField("internalDNS", "InternalDNS", false, func(m *Metadata) *string { return &m.InternalDNS }, true),
	stringField("externalDNS", "ExternalDNS", false, func(m *Metadata) *string { return &m.ExternalDNS }, true),
	stringField("manufacturer", "Manufacturer", true, func(m *Metadata) *string { return &m.Manufacturer }, false),
	stringField("productName", "ProductName", true, func(m *Metadata) *string { return &m.ProductName }, false),
	stringField("version", "Version", true, func(m *Metadata) *string { return &m.Version }, false),
	stringField("serialNumber", "SerialNumber", true, func(m *Metadata) *string { return &m.SerialNumber }, false),
	stringField("uuid", "UUID", true, func(m *Metadata) *string { return &m.UUID }, false),
	stringField("skuNumber", "SKUNumber", true, func(m *Metadata) *string { return &m.SKUNumber }, false),
}

// tagsPrefix introduces a key that names one platform tag: tags.<name>.
const tagsPrefix = "tags."

var (
	fieldsByKey    = map[string]*field{} // lower-case key → field
	fieldsByGoName = map[string]*field{} // template name → field
)

func init() {
	for i := range fields {
		fieldsByKey[strings.ToLower(fields[i].key)] = &fields[i]
		fieldsByGoName[fields[i].goName] = &fields[i]
	}
}

// fieldRef is a resolved metadata key: a field, or one tag.
type fieldRef struct {
	f   *field // nil for a tag
	tag string // tag name when f is nil
}

// resolveKey resolves a case-insensitive metadata key. The tag name after
// "tags." is matched exactly (cloud tags are case-sensitive).
func resolveKey(key string) (fieldRef, bool) {
	if f, ok := fieldsByKey[strings.ToLower(key)]; ok {
		return fieldRef{f: f}, true
	}
	if len(key) > len(tagsPrefix) && strings.EqualFold(key[:len(tagsPrefix)], tagsPrefix) {
		return fieldRef{tag: key[len(tagsPrefix):]}, true
	}
	return fieldRef{}, false
}

// String is the canonical spelling of the key.
func (r fieldRef) String() string {
	if r.f != nil {
		return r.f.key
	}
	return tagsPrefix + r.tag
}

func (r fieldRef) system() bool { return r.f != nil && r.f.system }

// lookup returns the value of the key in m and whether it is present: a string
// field is present when non-empty, spot always, a tag when the node has it.
func (r fieldRef) lookup(m *Metadata) (string, bool) {
	if r.f == nil {
		v, ok := m.Tags[r.tag]
		return v, ok
	}
	v := r.f.get(m)
	return v, v != "" || r.f.always
}

// assign sets the key in m to v.
func (r fieldRef) assign(m *Metadata, v string) error {
	if r.f == nil {
		if m.Tags == nil {
			m.Tags = map[string]string{}
		}
		m.Tags[r.tag] = v
		return nil
	}
	return r.f.assign(m, v)
}

// overridable reports whether platformMetadata may set the key.
func (r fieldRef) overridable() bool { return r.f == nil || r.f.overridable }

// override sets the key in m to a value a rule rendered.
func (r fieldRef) override(m *Metadata, v string) error {
	if r.f != nil && r.f.checkOverride != nil {
		if err := r.f.checkOverride(v); err != nil {
			return err
		}
	}
	return r.assign(m, v)
}

// ErrUnknownKey is returned by Metadata.Set for a key that names no field.
var ErrUnknownKey = errors.New("unknown metadata key")

// Set sets the field a key names, as selectors name them: case-insensitive
// ("instanceId" and "instanceID" both work), tags.<name> for one tag. A spot
// value must parse as a boolean. It is for building Metadata from text, such
// as a file of Talos resources.
func (m *Metadata) Set(key, value string) error {
	ref, ok := resolveKey(key)
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownKey, key)
	}
	return ref.assign(m, value)
}

// matchableKeys lists the documented selector keys, for error messages.
func matchableKeys() string {
	keys := make([]string, 0, len(fields)+1)
	for _, f := range fields {
		keys = append(keys, f.key)
	}
	return strings.Join(append(keys, "tags.<name>"), ", ")
}

// overridableKeys lists the keys platformMetadata may set, for error messages.
func overridableKeys() string {
	var keys []string
	for _, f := range fields {
		if f.overridable {
			keys = append(keys, f.key)
		}
	}
	return strings.Join(append(keys, "tags.<name>"), ", ")
}
