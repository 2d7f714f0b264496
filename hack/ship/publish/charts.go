package publish

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/hybrid-ccm/hybrid-ccm/hack/ship"
)

// imageValues are, per chart, the values naming an image of this repository:
// path of the repository value → image name. Their tags stay empty and so
// default to the chart's appVersion.
var imageValues = map[string]map[string]string{
	"talos-ccm":       {"image.repository": "talos-ccm", "test.image.repository": "hybridctl"},
	"ccm-coordinator": {"image.repository": "ccm-coordinator", "gate.image.repository": "ccm-gate", "test.image.repository": "hybridctl"},
}

// ReleaseCharts loads charts/<name> for every name in ship.Charts and returns them
// as a release of version pushes them: version and appVersion = version,
// image repositories under registry, the umbrella's dependencies pinned to
// version at oci://<registry>/charts and carried inside it. The working tree
// is not changed; values.yaml is edited as a YAML document (its comments
// stay).
func ReleaseCharts(root, registry, version string) ([]*chart.Chart, error) {
	registry = strings.TrimSuffix(registry, "/")
	byName := map[string]*chart.Chart{}
	var out []*chart.Chart
	for _, name := range ship.Charts {
		dir := filepath.Join(root, "charts", name)
		ch, err := loader.LoadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", dir, err)
		}
		ch.Metadata.Version, ch.Metadata.AppVersion = version, version
		set := map[string]string{}
		for path, image := range imageValues[name] {
			set[path] = registry + "/" + image
		}
		if err := setValues(ch, set); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, chartutil.ValuesfileName), err)
		}
		if len(ch.Metadata.Dependencies) > 0 {
			// What a working tree's `helm dependency build` left in charts/
			// is not what this release pushes.
			var deps []*chart.Chart
			for _, d := range ch.Metadata.Dependencies {
				sub, ok := byName[d.Name]
				if !ok {
					return nil, fmt.Errorf("%s: dependency %s is not released before it", dir, d.Name)
				}
				d.Version, d.Repository = version, "oci://"+registry+"/charts"
				deps = append(deps, sub)
			}
			ch.SetDependencies(deps...)
			ch.Lock = nil
		}
		if err := ch.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		byName[name] = ch
		out = append(out, ch)
	}
	return out, nil
}

// setValues sets string values (dotted paths of existing keys) in the chart's
// values.yaml document and its parsed values.
func setValues(ch *chart.Chart, set map[string]string) error {
	if len(set) == 0 {
		return nil
	}
	var raw *chart.File
	for _, f := range ch.Raw {
		if f.Name == chartutil.ValuesfileName {
			raw = f
		}
	}
	if raw == nil {
		return fmt.Errorf("no values file")
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw.Data, &doc); err != nil {
		return err
	}
	for path, value := range set {
		n, err := lookup(&doc, path)
		if err != nil {
			return err
		}
		if n.Kind != yaml.ScalarNode {
			return fmt.Errorf("%s is not a scalar", path)
		}
		n.Value, n.Tag, n.Style = value, "!!str", 0
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	values, err := chartutil.ReadValues(buf.Bytes())
	if err != nil {
		return err
	}
	raw.Data, ch.Values = buf.Bytes(), values
	return nil
}

// lookup finds the value node of a dotted path of mapping keys.
func lookup(doc *yaml.Node, path string) (*yaml.Node, error) {
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	for _, key := range strings.Split(path, ".") {
		if n.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("%s: %s is not a mapping", path, key)
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}
		if next == nil {
			return nil, fmt.Errorf("%s: no key %s", path, key)
		}
		n = next
	}
	return n, nil
}
