package release

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Manifests are the objects Helm rendered, in order. Mutators edit them in place.
type Manifests struct {
	Objects []*unstructured.Unstructured
}

// Find returns the objects of a kind.
func (m *Manifests) Find(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range m.Objects {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// Remove drops every object for which drop returns true and returns them.
func (m *Manifests) Remove(drop func(*unstructured.Unstructured) bool) []*unstructured.Unstructured {
	var kept, removed []*unstructured.Unstructured
	for _, o := range m.Objects {
		if drop(o) {
			removed = append(removed, o)
		} else {
			kept = append(kept, o)
		}
	}
	m.Objects = kept
	return removed
}

// Add appends objects.
func (m *Manifests) Add(objs ...*unstructured.Unstructured) { m.Objects = append(m.Objects, objs...) }

// Mutator changes the rendered manifests of a release. The lifecycle-only
// enforcement is one; the gate (sidecar, kubeconfig, policy) plugs in as others.
// Mutators run in order after Helm rendered the chart and before anything is sent
// to the API server, for every chart source.
type Mutator interface {
	// Name identifies the mutator in errors.
	Name() string
	// Fingerprint changes whenever the mutator's output for the same input would
	// change; it is part of the release digest, so a change triggers an upgrade.
	Fingerprint() string
	// Mutate edits the manifests.
	Mutate(m *Manifests) error
}

// PostRender runs every mutator of the request over manifests as Helm
// rendered them, the lifecycle enforcement first, and returns the result.
// The Helm engine calls it as its post-renderer; it is the same for every
// chart source.
func (r Request) PostRender(rendered []byte) ([]byte, error) {
	const op = "release/Request.PostRender"
	m, err := ParseManifests(rendered)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	for _, mu := range r.mutators() {
		if err := mu.Mutate(m); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", op, mu.Name(), err)
		}
	}
	return m.Encode()
}

// mutators are the mutators every rendered manifest of the request goes
// through, in order: the lifecycle enforcement, then Mutators.
func (r Request) mutators() []Mutator {
	return append([]Mutator{r.Lifecycle}, r.Mutators...)
}

// ParseManifests reads rendered manifests (YAML documents or JSON, lists
// flattened) into objects.
func ParseManifests(data []byte) (*Manifests, error) {
	m := &Manifests{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("parse rendered manifests: %w", err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.IsList() {
			if err := u.EachListItem(func(o runtime.Object) error {
				m.Objects = append(m.Objects, o.(*unstructured.Unstructured))
				return nil
			}); err != nil {
				return nil, err
			}
			continue
		}
		if u.GetKind() == "" {
			return nil, fmt.Errorf("rendered object without kind: %s", strings.TrimSpace(fmt.Sprint(obj)))
		}
		m.Objects = append(m.Objects, u)
	}
	return m, nil
}

// Encode writes the objects as YAML documents, in order.
func (m *Manifests) Encode() ([]byte, error) {
	var out bytes.Buffer
	for _, o := range m.Objects {
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			return nil, err
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	return out.Bytes(), nil
}
