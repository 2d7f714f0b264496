package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	yaml "go.yaml.in/yaml/v3"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
)

// MetadataSource supplies the metadata `transform explain` evaluates the
// rules against: what talos-ccm would read from a node's Talos API.
type MetadataSource interface {
	// Metadata reads it. Warnings are remarks that do not stop explain.
	Metadata(ctx context.Context) (md transform.Metadata, warnings []string, err error)
	// String names the source in the report, e.g. "file node.yaml".
	String() string
}

// maxMetadataFileBytes caps a metadata file.
const maxMetadataFileBytes = 4 << 20

// FileMetadataSource reads metadata from a YAML or JSON file (see ParseMetadata).
type FileMetadataSource struct{ Path string }

var _ MetadataSource = FileMetadataSource{}

func (s FileMetadataSource) String() string { return "file " + s.Path }

// Metadata implements MetadataSource.
func (s FileMetadataSource) Metadata(context.Context) (transform.Metadata, []string, error) {
	f, err := os.Open(s.Path)
	if err != nil {
		return transform.Metadata{}, nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxMetadataFileBytes+1))
	if err != nil {
		return transform.Metadata{}, nil, fmt.Errorf("%s: %w", s.Path, err)
	}
	if len(data) > maxMetadataFileBytes {
		return transform.Metadata{}, nil, fmt.Errorf("%s: larger than %d bytes", s.Path, maxMetadataFileBytes)
	}
	md, warnings, err := ParseMetadata(data)
	for i := range warnings {
		warnings[i] = s.Path + ": " + warnings[i]
	}
	if err != nil {
		return md, warnings, fmt.Errorf("%s: %w", s.Path, err)
	}
	if md.Hostname == "" {
		warnings = append(warnings, s.Path+": no hostname: talos-ccm matches and renders the node name in its place; write it as hostname to see that")
	}
	return md, warnings, nil
}

// ParseMetadata reads node metadata from YAML (or JSON) in either form:
//
//   - the fields themselves, with the Talos PlatformMetadata keys (platform,
//     hostname, region, zone, instanceType, instanceId, providerId, spot,
//     internalDNS, externalDNS, tags) and, optionally, the SystemInformation
//     ones (manufacturer, productName, version, serialNumber, uuid, skuNumber);
//   - Talos resources as `talosctl get platformmetadata -o yaml` and
//     `talosctl get systeminformation -o yaml` print them (fields under spec:),
//     one document each, separated by ---.
//
// Keys are case-insensitive. Unknown keys are warnings, so that output of a
// newer Talos still works. A file describes one node.
func ParseMetadata(data []byte) (transform.Metadata, []string, error) {
	var (
		md       transform.Metadata
		warnings []string
		seen     = map[string]int{} // document kind → line of the first
		docs     int
	)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return md, warnings, err
		}
		if len(doc.Content) == 0 {
			continue
		}
		root := doc.Content[0]
		if root.Kind != yaml.MappingNode {
			return md, warnings, fmt.Errorf("line %d: a metadata document must be a mapping", root.Line)
		}
		docs++
		body, kind, err := metadataBody(root)
		if err != nil {
			return md, warnings, err
		}
		if first, dup := seen[kind]; dup {
			return md, warnings, fmt.Errorf("line %d: a second %s document (the first is on line %d): explain one node at a time", root.Line, kind, first)
		}
		seen[kind] = root.Line
		w, err := setFields(&md, body)
		warnings = append(warnings, w...)
		if err != nil {
			return md, warnings, err
		}
	}
	if docs == 0 {
		return md, warnings, errors.New("no metadata in the file")
	}
	return md, warnings, nil
}

// metadataBody returns the mapping that holds the fields, and what kind of
// document it is.
func metadataBody(root *yaml.Node) (*yaml.Node, string, error) {
	spec := mappingValue(root, "spec")
	if spec == nil {
		return root, "metadata", nil
	}
	if spec.Kind != yaml.MappingNode {
		return nil, "", fmt.Errorf("line %d: spec must be a mapping", spec.Line)
	}
	typ := ""
	if meta := mappingValue(root, "metadata"); meta != nil {
		if t := mappingValue(meta, "type"); t != nil {
			typ = t.Value
		}
	}
	switch lower := strings.ToLower(typ); {
	case lower == "" || strings.HasPrefix(lower, "platformmetadatas."):
		return spec, "PlatformMetadata", nil
	case strings.HasPrefix(lower, "systeminformations."):
		return spec, "SystemInformation", nil
	}
	return nil, "", fmt.Errorf("line %d: resource type %q is neither PlatformMetadatas.talos.dev nor SystemInformations.hardware.talos.dev", root.Line, typ)
}

func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// ignoredKeys are fields Talos resources have that rules do not use.
var ignoredKeys = map[string]bool{"wakeuptype": true, "family": true}

func setFields(md *transform.Metadata, body *yaml.Node) (warnings []string, err error) {
	for i := 0; i+1 < len(body.Content); i += 2 {
		k, v := body.Content[i], body.Content[i+1]
		key := k.Value
		switch {
		case strings.EqualFold(key, "tags"):
			if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
				continue
			}
			if v.Kind != yaml.MappingNode {
				return warnings, fmt.Errorf("line %d: tags must be a mapping", v.Line)
			}
			for j := 0; j+1 < len(v.Content); j += 2 {
				tk, tv := v.Content[j], v.Content[j+1]
				if tv.Kind != yaml.ScalarNode {
					return warnings, fmt.Errorf("line %d: tag %q must be a string", tv.Line, tk.Value)
				}
				if md.Tags == nil {
					md.Tags = map[string]string{}
				}
				md.Tags[tk.Value] = scalar(tv)
			}
		case ignoredKeys[strings.ToLower(key)]:
		case strings.HasPrefix(strings.ToLower(key), "tags."):
			warnings = append(warnings, fmt.Sprintf("line %d: unknown key %q ignored (write tags as a mapping)", k.Line, key))
		default:
			if v.Kind != yaml.ScalarNode {
				warnings = append(warnings, fmt.Sprintf("line %d: key %q ignored: not a single value", k.Line, key))
				continue
			}
			if err := md.Set(key, scalar(v)); errors.Is(err, transform.ErrUnknownKey) {
				warnings = append(warnings, fmt.Sprintf("line %d: unknown key %q ignored", k.Line, key))
			} else if err != nil {
				return warnings, fmt.Errorf("line %d: %w", v.Line, err)
			}
		}
	}
	return warnings, nil
}

func scalar(n *yaml.Node) string {
	if n.ShortTag() == "!!null" {
		return ""
	}
	return n.Value
}
