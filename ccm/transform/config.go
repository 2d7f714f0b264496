package transform

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// MaxConfigBytes caps the size of a configuration file.
const MaxConfigBytes = 4 << 20

// Config is the talos-ccm configuration file (--cloud-config): global settings
// and the transformation rules. The zero value is valid and has no rules.
//
// Parse and Load validate and compile the rules; Apply uses that compiled form.
// A Config built in code (not parsed) is compiled on every Apply call.
type Config struct {
	Global          Global           `json:"global"`
	Transformations []Transformation `json:"transformations,omitempty"`

	source string   // file name for messages
	prog   *program // compiled by Parse
}

// Global holds settings that apply to every node.
type Global struct {
	// ClusterName becomes the node.cloudprovider.kubernetes.io/clustername label.
	// Also accepted as ClusterName.
	ClusterName string `json:"clusterName,omitempty"`
	// PreferIPv6 orders IPv6 node addresses first. Also accepted as PreferIPv6.
	PreferIPv6 bool `json:"preferIPv6,omitempty"`
	// Enforce keeps rule output reconciled on initialized nodes and removes
	// what rules no longer produce (see Plan). Off by default.
	Enforce bool `json:"enforce,omitempty"`
	// Endpoints are Talos API endpoints used instead of the talosconfig's,
	// as the upstream Talos CCM reads them; --talos-endpoints wins over
	// them. Also accepted as Endpoints.
	Endpoints []string `json:"endpoints,omitempty"`
}

// Transformation is one rule: where it applies (NodeSelector) and what it
// gives a node there.
type Transformation struct {
	// Name identifies the rule in messages and Result.Matched; optional,
	// unique when set.
	Name string `json:"name,omitempty"`
	// NodeSelector terms are ORed; an empty selector matches every node.
	NodeSelector []SelectorTerm `json:"nodeSelector,omitempty"`
	// Labels, Annotations: literal keys, values are templates over Metadata.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Taints: literal keys and effects, values are templates. In YAML either
	// a list of {key, value, effect} or a map key: "value:Effect" / "Effect".
	Taints []Taint `json:"taints,omitempty"`
	// PlatformMetadata overrides metadata fields (keys case-insensitive);
	// values are templates. Later rules see the overridden metadata.
	PlatformMetadata map[string]string `json:"platformMetadata,omitempty"`
	// Features are switched on for matched nodes.
	Features Features `json:"features,omitempty"`

	lines map[string]int  // field path → YAML line
	bad   map[string]bool // field paths the decoder reported
}

// reported tells whether the decoder already reported path or a field above it.
func (t *Transformation) reported(path string) bool {
	for p := range t.bad {
		if p == "" || path == p || strings.HasPrefix(path, p+".") || strings.HasPrefix(path, p+"[") {
			return true
		}
	}
	return false
}

// line returns the YAML line of a field path in the rule, or of the rule.
func (t *Transformation) line(path string) int {
	if l, ok := t.lines[path]; ok {
		return l
	}
	return t.lines[""]
}

// SelectorTerm holds expressions that must all hold.
type SelectorTerm struct {
	MatchExpressions []Expression `json:"matchExpressions"`
}

// Expression tests one metadata key.
type Expression struct {
	// Key is a metadata field name, case-insensitive, or tags.<name>.
	Key      string   `json:"key"`
	Operator Operator `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// Operator of an Expression.
type Operator string

// Operators. An expression on a key the node does not have is false, except
// DoesNotExist. A string field is present when non-empty, spot always, a tag
// when the node has it.
const (
	OpIn           Operator = "In"           // value equals one of Values
	OpNotIn        Operator = "NotIn"        // value equals none of Values
	OpExists       Operator = "Exists"       // key present; no Values
	OpDoesNotExist Operator = "DoesNotExist" // key absent; no Values
	OpGt           Operator = "Gt"           // integer value > the one integer in Values
	OpLt           Operator = "Lt"           // integer value < the one integer in Values
	OpRegexp       Operator = "Regexp"       // value matches one of the Go regexps in Values
)

var operators = []Operator{OpIn, OpNotIn, OpExists, OpDoesNotExist, OpGt, OpLt, OpRegexp}

// Operators returns every operator Parse accepts. The talos-ccm chart's
// values.schema.json lists them again (charts/test checks that both agree).
func Operators() []Operator { return slices.Clone(operators) }

// Taint is a taint a rule adds. Value is a template; Key and Effect are literal.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`

	path string // field path in the YAML file
}

// Features are per-node switches a rule can turn on; the result is the OR
// over all matched rules.
type Features struct {
	// PublicIPDiscovery makes talos-ccm report the node's public
	// (global-unicast, non-private) addresses as ExternalIPs.
	PublicIPDiscovery bool `json:"publicIPDiscovery,omitempty"`
}

// Error is a configuration error (from Parse) or a rule evaluation error
// (from Apply). It names the file, the rule and the field.
type Error struct {
	Source string // file name
	Line   int    // line in the file; 0 if unknown
	Rule   string // `transformations[1] "web-nodes"`; empty outside a rule
	Field  string // path in the rule (or in the file outside a rule)
	Err    error
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Source != "" {
		b.WriteString(e.Source)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Rule != "" {
		b.WriteString(e.Rule)
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// ruleLabel names rule i in messages.
func ruleLabel(i int, name string) string {
	if name != "" {
		return fmt.Sprintf("transformations[%d] %q", i, name)
	}
	return fmt.Sprintf("transformations[%d]", i)
}

// Load reads, parses and validates a configuration file. Errors name path.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("transformations: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("transformations: %s: %w", path, err)
	}
	return Parse(data, path)
}

// Parse parses and validates a configuration; source names it in errors.
// Unknown fields, invalid keys, operators, values, regexps and templates are
// errors, all reported at once (errors.Join of *Error).
func Parse(data []byte, source string) (*Config, error) {
	if source == "" {
		source = "<config>"
	}
	if len(data) > MaxConfigBytes {
		return nil, &Error{Source: source, Err: fmt.Errorf("file larger than %d bytes", MaxConfigBytes)}
	}
	c := &Config{source: source}
	root, err := parseYAML(data)
	if err != nil {
		return nil, &Error{Source: source, Err: err}
	}
	d := &decoder{source: source, budget: maxNodes}
	d.config(root, c)
	// Compile what could be decoded too, so that all errors come at once;
	// fields the decoder already reported are not reported again.
	prog, errs := compile(c)
	if errs = append(d.errs, errs...); len(errs) > 0 {
		sortByLine(errs)
		return nil, errors.Join(errs...)
	}
	c.prog = prog
	return c, nil
}

// Source is the name the configuration was parsed from.
func (c *Config) Source() string { return c.source }

// program returns the compiled rules: those of Parse, or compiled now for a
// Config built in code.
func (c *Config) program() (*program, error) {
	if c.prog != nil {
		return c.prog, nil
	}
	if len(c.Transformations) == 0 {
		return &program{}, nil
	}
	prog, errs := compile(c)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return prog, nil
}

// NeedsSystemInformation reports whether any rule's selector or template
// refers to a SystemInformation field, so that the caller can skip reading it
// otherwise. It is true for an invalid configuration built in code.
func (c *Config) NeedsSystemInformation() bool {
	prog, err := c.program()
	return err != nil || prog.system
}

// sortByLine orders errors as they appear in the file.
func sortByLine(errs []error) {
	line := func(err error) int {
		var e *Error
		if errors.As(err, &e) {
			return e.Line
		}
		return 0
	}
	slices.SortStableFunc(errs, func(a, b error) int { return line(a) - line(b) })
}
