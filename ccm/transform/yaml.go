package transform

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// maxNodes bounds the YAML nodes the decoder visits, aliases included, so a
// small document of nested aliases cannot make it work for long.
const maxNodes = 200_000

// parseYAML reads exactly one YAML document (or none: nil) into a node tree.
func parseYAML(data []byte) (root *yaml.Node, err error) {
	defer func() {
		// The YAML library turns its own failures into errors; should
		// anything still escape it, it is an error here too, never a crash.
		if r := recover(); r != nil {
			root, err = nil, fmt.Errorf("yaml: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, err
	default:
		return nil, fmt.Errorf("line %d: more than one YAML document", next.Line)
	}
	return &doc, nil
}

// decoder turns the node tree into a Config. It is strict: unknown and
// duplicate keys and wrongly shaped values are errors with their line.
type decoder struct {
	source string
	errs   []error
	budget int
	bad    map[string]bool // paths reported in the rule being decoded
}

// entry is one key of a mapping.
type entry struct {
	name string // key, with accepted alternative spellings made canonical
	k, v *yaml.Node
}

var (
	rootFields       = []string{"global", "transformations"}
	globalFields     = []string{"clusterName", "preferIPv6", "enforce", "endpoints"}
	ruleFields       = []string{"name", "nodeSelector", "labels", "annotations", "taints", "platformMetadata", "features"}
	termFields       = []string{"matchExpressions"}
	expressionFields = []string{"key", "operator", "values"}
	taintFields      = []string{"key", "value", "effect"}
	featureFields    = []string{"publicIPDiscovery"}

	// globalAliases are the spellings the upstream Talos CCM documents.
	globalAliases = map[string]string{"ClusterName": "clusterName", "PreferIPv6": "preferIPv6", "Enforce": "enforce", "Endpoints": "endpoints"}
)

func (d *decoder) errorf(n *yaml.Node, rule, path, format string, a ...any) {
	e := &Error{Source: d.source, Rule: rule, Field: path, Err: fmt.Errorf(format, a...)}
	if d.bad != nil {
		d.bad[path] = true
	}
	if n != nil {
		e.Line = n.Line
	}
	d.errs = append(d.errs, e)
}

// resolve follows aliases and counts the node against the budget; it
// returns nil once the budget is spent.
func (d *decoder) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > 32 {
			return nil
		}
		n = n.Alias
	}
	d.budget--
	if d.budget == 0 {
		d.errs = append(d.errs, &Error{Source: d.source, Err: fmt.Errorf("document too complex: more than %d nodes (aliases included)", maxNodes)})
	}
	if d.budget < 0 {
		return nil
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "empty"
}

// fieldPath and keyPath extend a field path by a struct field or a map key.
func fieldPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func keyPath(path, key string) string { return path + "[" + strconv.Quote(key) + "]" }

// entries returns the keys of a mapping in document order, merge keys (<<)
// included. With known set, it is a struct: keys outside known (after
// aliases) are errors; without, a map with arbitrary keys.
func (d *decoder) entries(n *yaml.Node, rule, path string, known []string, aliases map[string]string) []entry {
	n = d.resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, rule, path, "must be a mapping, not %s", kindName(n))
		return nil
	}
	sub := func(key string) string {
		if known == nil {
			return keyPath(path, key)
		}
		return fieldPath(path, key)
	}
	var out, merged []entry
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.resolve(n.Content[i]), n.Content[i+1]
		if k == nil {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, rule, path, "keys must be strings, not %s", kindName(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			merged = append(merged, d.merge(v, rule, path, known, aliases)...)
			continue
		}
		name := k.Value
		if canonical, ok := aliases[name]; ok {
			name = canonical
		}
		if known != nil && !slices.Contains(known, name) {
			hint := ""
			if f := closest(name, known); f != "" {
				hint = fmt.Sprintf(" (did you mean %q?)", f)
			}
			d.errorf(k, rule, sub(k.Value), "unknown field%s; fields here are %s", hint, strings.Join(known, ", "))
			continue
		}
		if prev, dup := seen[name]; dup {
			d.errorf(k, rule, sub(k.Value), "duplicate key (first on line %d)", prev.Line)
			continue
		}
		seen[name] = k
		out = append(out, entry{name: name, k: k, v: v})
	}
	for _, e := range merged {
		if _, ok := seen[e.name]; !ok {
			seen[e.name] = e.k
			out = append(out, e)
		}
	}
	return out
}

// merge returns the entries a merge key (<<: *x or <<: [*x, *y]) brings in.
func (d *decoder) merge(v *yaml.Node, rule, path string, known []string, aliases map[string]string) []entry {
	n := d.resolve(v)
	if n != nil && n.Kind == yaml.SequenceNode {
		var out []entry
		for _, item := range n.Content {
			out = append(out, d.entries(item, rule, path, known, aliases)...)
		}
		return out
	}
	if n == nil || n.Kind != yaml.MappingNode {
		d.errorf(v, rule, path, "a merge key (<<) needs a mapping or a list of mappings")
		return nil
	}
	return d.entries(n, rule, path, known, aliases)
}

func (d *decoder) str(n *yaml.Node, rule, path string) string {
	n = d.resolve(n)
	if isNull(n) {
		return ""
	}
	if n.Kind != yaml.ScalarNode {
		d.errorf(n, rule, path, "must be a string, not %s", kindName(n))
		return ""
	}
	return n.Value
}

func (d *decoder) boolean(n *yaml.Node, rule, path string) bool {
	n = d.resolve(n)
	if isNull(n) {
		return false
	}
	if n.Kind == yaml.ScalarNode {
		var b bool
		if err := n.Decode(&b); err == nil {
			return b
		}
		if b, err := strconv.ParseBool(n.Value); err == nil {
			return b
		}
	}
	d.errorf(n, rule, path, "must be true or false, not %s", kindName(n))
	return false
}

func (d *decoder) list(n *yaml.Node, rule, path string) []*yaml.Node {
	r := d.resolve(n)
	if isNull(r) {
		return nil
	}
	if r.Kind != yaml.SequenceNode {
		d.errorf(r, rule, path, "must be a list, not %s", kindName(r))
		return nil
	}
	return r.Content
}

func (d *decoder) config(root *yaml.Node, c *Config) {
	if root == nil {
		return
	}
	n := root
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return
		}
		n = n.Content[0]
	}
	for _, e := range d.entries(n, "", "", rootFields, nil) {
		switch e.name {
		case "global":
			for _, g := range d.entries(e.v, "", "global", globalFields, globalAliases) {
				p := fieldPath("global", g.k.Value)
				switch g.name {
				case "clusterName":
					c.Global.ClusterName = d.str(g.v, "", p)
				case "preferIPv6":
					c.Global.PreferIPv6 = d.boolean(g.v, "", p)
				case "enforce":
					c.Global.Enforce = d.boolean(g.v, "", p)
				case "endpoints":
					for i, item := range d.list(g.v, "", p) {
						ep := d.str(item, "", fmt.Sprintf("%s[%d]", p, i))
						if strings.TrimSpace(ep) == "" {
							d.errorf(item, "", fmt.Sprintf("%s[%d]", p, i), "must be a Talos API endpoint (an address or host name, optionally with :port), not empty")
							continue
						}
						c.Global.Endpoints = append(c.Global.Endpoints, ep)
					}
				}
			}
		case "transformations":
			for i, item := range d.list(e.v, "", "transformations") {
				c.Transformations = append(c.Transformations, d.rule(item, i))
			}
		}
	}
}

// ruleName finds a rule's name before decoding it, so that every error about
// the rule can carry it.
func ruleName(n *yaml.Node) string {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias // a loop is impossible: the parser rejects recursive aliases
	}
	if n == nil || n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k, v := n.Content[i], n.Content[i+1]; k.Value == "name" && v.Kind == yaml.ScalarNode {
			return v.Value
		}
	}
	return ""
}

func (d *decoder) rule(n *yaml.Node, i int) Transformation {
	label := ruleLabel(i, ruleName(n))
	t := Transformation{lines: map[string]int{"": n.Line}, bad: map[string]bool{}}
	d.bad = t.bad
	defer func() { d.bad = nil }()
	r := d.resolve(n)
	if r == nil || r.Kind != yaml.MappingNode {
		if r != nil {
			d.errorf(r, label, "", "a rule must be a mapping, not %s", kindName(r))
		}
		return t
	}
	for _, e := range d.entries(r, label, "", ruleFields, nil) {
		t.lines[e.name] = e.k.Line
		switch e.name {
		case "name":
			t.Name = d.str(e.v, label, "name")
		case "nodeSelector":
			t.NodeSelector = d.selector(e.v, label, &t)
		case "labels":
			t.Labels = d.stringMap(e.v, label, "labels", &t)
		case "annotations":
			t.Annotations = d.stringMap(e.v, label, "annotations", &t)
		case "taints":
			t.Taints = d.taints(e.v, label, &t)
		case "platformMetadata":
			t.PlatformMetadata = d.stringMap(e.v, label, "platformMetadata", &t)
		case "features":
			for _, f := range d.entries(e.v, label, "features", featureFields, nil) {
				t.Features.PublicIPDiscovery = d.boolean(f.v, label, "features.publicIPDiscovery")
			}
		}
	}
	return t
}

func (d *decoder) selector(n *yaml.Node, label string, t *Transformation) []SelectorTerm {
	var terms []SelectorTerm
	for ti, tn := range d.list(n, label, "nodeSelector") {
		tp := fmt.Sprintf("nodeSelector[%d]", ti)
		t.lines[tp] = tn.Line
		var term SelectorTerm
		for _, e := range d.entries(tn, label, tp, termFields, nil) {
			for ei, en := range d.list(e.v, label, tp+".matchExpressions") {
				ep := fmt.Sprintf("%s.matchExpressions[%d]", tp, ei)
				t.lines[ep] = en.Line
				var ex Expression
				for _, f := range d.entries(en, label, ep, expressionFields, nil) {
					fp := fieldPath(ep, f.name)
					t.lines[fp] = f.k.Line
					switch f.name {
					case "key":
						ex.Key = d.str(f.v, label, fp)
					case "operator":
						ex.Operator = Operator(d.str(f.v, label, fp))
					case "values":
						values := d.list(f.v, label, fp)
						ex.Values = make([]string, 0, len(values))
						for vi, vn := range values {
							vp := fmt.Sprintf("%s[%d]", fp, vi)
							t.lines[vp] = vn.Line
							ex.Values = append(ex.Values, d.str(vn, label, vp))
						}
					}
				}
				term.MatchExpressions = append(term.MatchExpressions, ex)
			}
		}
		terms = append(terms, term)
	}
	return terms
}

func (d *decoder) stringMap(n *yaml.Node, label, path string, t *Transformation) map[string]string {
	es := d.entries(n, label, path, nil, nil)
	if len(es) == 0 {
		return nil
	}
	m := make(map[string]string, len(es))
	for _, e := range es {
		p := keyPath(path, e.name)
		t.lines[p] = e.k.Line
		m[e.name] = d.str(e.v, label, p)
	}
	return m
}

// taints accepts a list of {key, value, effect} or the upstream map form
// key: "value:Effect" (or key: "Effect").
func (d *decoder) taints(n *yaml.Node, label string, t *Transformation) []Taint {
	r := d.resolve(n)
	if isNull(r) {
		return nil
	}
	var out []Taint
	switch r.Kind {
	case yaml.SequenceNode:
		for i, item := range r.Content {
			tt := Taint{path: fmt.Sprintf("taints[%d]", i)}
			t.lines[tt.path] = item.Line
			for _, f := range d.entries(item, label, tt.path, taintFields, nil) {
				fp := fieldPath(tt.path, f.name)
				t.lines[fp] = f.k.Line
				switch f.name {
				case "key":
					tt.Key = d.str(f.v, label, fp)
				case "value":
					tt.Value = d.str(f.v, label, fp)
				case "effect":
					tt.Effect = d.str(f.v, label, fp)
				}
			}
			out = append(out, tt)
		}
	case yaml.MappingNode:
		for _, e := range d.entries(r, label, "taints", nil, nil) {
			tt := Taint{Key: e.name, path: keyPath("taints", e.name)}
			t.lines[tt.path] = e.k.Line
			tt.Value, tt.Effect = splitTaint(d.str(e.v, label, tt.path))
			out = append(out, tt)
		}
	default:
		d.errorf(r, label, "taints", `must be a list of {key, value, effect} or a map of key: "value:Effect", not %s`, kindName(r))
	}
	return out
}

// splitTaint splits the map form "value:Effect" (or "Effect") at the last
// colon outside template actions: the effect is always literal.
func splitTaint(s string) (value, effect string) {
	i := strings.LastIndex(s, ":")
	if i >= 0 && i > strings.LastIndex(s, "}}") {
		return s[:i], strings.TrimSpace(s[i+1:])
	}
	return "", strings.TrimSpace(s)
}

// closest returns the candidate nearest to s (case-insensitive edit distance
// of at most 2), or "".
func closest(s string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(s), strings.ToLower(c)); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
