package transform

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"text/template"
	"text/template/parse"
)

// MaxValueBytes caps the length of one rendered value (label, annotation,
// taint or metadata override). A template that would produce more fails.
const MaxValueBytes = 32 << 10

// MaxMetadataBytes caps the total length of the metadata strings (fields, tag
// names and values) a node reports; rules are not applied to larger metadata.
// The metadata comes from the node itself, so it is bounded before templates
// work on it.
const MaxMetadataBytes = 64 << 10

// errTooLong reports a rendered value over MaxValueBytes.
var errTooLong = fmt.Errorf("rendered value longer than %d bytes", MaxValueBytes)

// funcs are the functions templates may call besides the text/template
// built-ins. As in sprig, the string operated on is the last argument, so
// that pipelines read naturally: {{ .Hostname | trimSuffix ".internal" }}.
var funcs = template.FuncMap{
	"upper":           strings.ToUpper,
	"lower":           strings.ToLower,
	"trim":            strings.TrimSpace,
	"trimSuffix":      func(suffix, s string) string { return strings.TrimSuffix(s, suffix) },
	"trimPrefix":      func(prefix, s string) string { return strings.TrimPrefix(s, prefix) },
	"replace":         replace,
	"regexFind":       regexFind,
	"regexFindString": regexFindString,
	"regexReplaceAll": regexReplaceAll,
	"contains":        func(substr, s string) bool { return strings.Contains(s, substr) },
	"hasPrefix":       func(prefix, s string) bool { return strings.HasPrefix(s, prefix) },
	"hasSuffix":       func(suffix, s string) bool { return strings.HasSuffix(s, suffix) },
	"b64enc":          func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
	"b64dec":          b64dec,
	"default":         defaultValue,
	"coalesce":        coalesce,
	"ternary":         ternary,
	"empty":           empty,
	"getValue":        getValue,
}

// regexpFuncs take a pattern as their first argument; literal patterns are
// compiled when the configuration is parsed.
var regexpFuncs = map[string]bool{"regexFind": true, "regexFindString": true, "regexReplaceAll": true}

func replace(old, replacement, s string) (string, error) {
	n := strings.Count(s, old) // len(s)+1 when old is empty
	if len(s)+n*(len(replacement)-len(old)) > MaxValueBytes {
		return "", errTooLong
	}
	return strings.ReplaceAll(s, old, replacement), nil
}

func regexFind(pattern, s string) (string, error) {
	re, err := cachedRegexp(pattern)
	if err != nil {
		return "", err
	}
	return re.FindString(s), nil
}

// regexFindString returns submatch n of the first match, or "" if there is no
// match or no such submatch.
func regexFindString(pattern, s string, n int) (string, error) {
	re, err := cachedRegexp(pattern)
	if err != nil {
		return "", err
	}
	m := re.FindStringSubmatch(s)
	if n < 0 || n >= len(m) {
		return "", nil
	}
	return m[n], nil
}

// regexReplaceAll is regexp.ReplaceAllString (with $1 expansion) that stops
// once the result would exceed MaxValueBytes instead of allocating it.
func regexReplaceAll(pattern, s, repl string) (string, error) {
	re, err := cachedRegexp(pattern)
	if err != nil {
		return "", err
	}
	var out []byte
	last := 0
	for _, m := range re.FindAllStringSubmatchIndex(s, -1) {
		out = append(out, s[last:m[0]]...)
		out = re.ExpandString(out, repl, s, m)
		last = m[1]
		if len(out) > MaxValueBytes {
			return "", errTooLong
		}
	}
	out = append(out, s[last:]...)
	if len(out) > MaxValueBytes {
		return "", errTooLong
	}
	return string(out), nil
}

func b64dec(s string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("b64dec: %w", err)
	}
	return string(b), nil
}

// defaultValue returns given unless it is missing or empty, else def:
// {{ .Zone | default "unknown" }}.
func defaultValue(def any, given ...any) any {
	if len(given) == 0 || empty(given[0]) {
		return def
	}
	return given[0]
}

// coalesce returns the first non-empty argument, or "".
func coalesce(v ...any) any {
	for _, x := range v {
		if !empty(x) {
			return x
		}
	}
	return ""
}

// ternary returns a if cond holds, else b: {{ ternary "spot" "on-demand" .Spot }}.
func ternary(a, b any, cond bool) any {
	if cond {
		return a
	}
	return b
}

// empty reports whether v is nil or its type's zero value (or an empty map).
func empty(v any) bool {
	r := reflect.ValueOf(v)
	if !r.IsValid() {
		return true
	}
	switch r.Kind() {
	case reflect.Map, reflect.Slice, reflect.Array, reflect.String:
		return r.Len() == 0
	}
	return r.IsZero()
}

// getValue returns the value of key in a "k1=v1;k2=v2" list, or "".
func getValue(list, key string) string {
	for item := range strings.SplitSeq(list, ";") {
		if k, v, ok := strings.Cut(item, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// regexpCache keeps compiled patterns used by template functions; patterns
// come from the configuration, so the set is small. It is bounded anyway.
var regexpCache = struct {
	sync.Mutex
	m map[string]*regexp.Regexp
}{m: map[string]*regexp.Regexp{}}

const regexpCacheSize = 256

func cachedRegexp(pattern string) (*regexp.Regexp, error) {
	regexpCache.Lock()
	re, ok := regexpCache.m[pattern]
	regexpCache.Unlock()
	if ok {
		return re, nil
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("invalid regexp %q: %w", pattern, err)
	}
	regexpCache.Lock()
	if len(regexpCache.m) < regexpCacheSize {
		regexpCache.m[pattern] = re
	}
	regexpCache.Unlock()
	return re, nil
}

// value is a compiled configuration value: a constant, or a template over
// Metadata.
type value struct {
	text   string             // as written
	tmpl   *template.Template // nil for a constant
	system bool               // refers to a SystemInformation field
}

// constant reports whether the value contains no template action.
func (v *value) constant() bool { return v.tmpl == nil }

// compileValue parses text as a template and checks what it refers to:
// unknown fields, invalid literal regexps and constructs that could run
// unbounded ({{range}} over anything but .Tags, {{template}}, {{define}}) are
// errors here, not at Apply time.
func compileValue(text string) (*value, error) {
	t, err := template.New("value").Funcs(funcs).Option("missingkey=zero").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("invalid template: %s", strings.TrimPrefix(err.Error(), "template: "))
	}
	if len(t.Templates()) > 1 {
		return nil, errors.New("invalid template: {{define}} and {{block}} are not supported")
	}
	v := &value{text: text}
	if t.Tree == nil || t.Root == nil {
		return v, nil
	}
	c := &checker{}
	c.walk(t.Root, true)
	if c.err != nil {
		return nil, fmt.Errorf("invalid template: %w", c.err)
	}
	if c.actions {
		v.tmpl, v.system = t, c.system
	}
	return v, nil
}

// render evaluates the value against md.
func (v *value) render(md *Metadata) (s string, err error) {
	if v.tmpl == nil {
		return v.text, nil
	}
	defer func() {
		// text/template recovers what functions panic with; this is for
		// anything else: a rule must never crash the controller.
		if r := recover(); r != nil {
			err = fmt.Errorf("template failed: %v", r)
		}
	}()
	var b cappedBuffer
	if err := v.tmpl.Execute(&b, *md); err != nil {
		if errors.Is(err, errTooLong) {
			return "", errTooLong
		}
		return "", fmt.Errorf("template failed: %s", strings.TrimPrefix(err.Error(), "template: "))
	}
	return b.String(), nil
}

// cappedBuffer refuses to grow beyond MaxValueBytes, which also stops a
// template that keeps writing.
type cappedBuffer struct{ bytes.Buffer }

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > MaxValueBytes {
		return 0, errTooLong
	}
	return b.Buffer.Write(p)
}

// checker walks a template's parse tree.
type checker struct {
	actions bool // the template has more than text
	system  bool // refers to SystemInformation (or to all of the metadata)
	inRange bool // inside a {{range}}
	err     error
}

func (c *checker) fail(format string, a ...any) {
	if c.err == nil {
		c.err = fmt.Errorf(format, a...)
	}
}

// walk visits n; root reports whether dot is the Metadata there.
func (c *checker) walk(n parse.Node, root bool) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, x := range n.Nodes {
			c.walk(x, root)
		}
	case *parse.TextNode, *parse.CommentNode:
	case *parse.ActionNode:
		c.actions = true
		c.walk(n.Pipe, root)
	case *parse.IfNode:
		c.actions = true
		c.walk(n.Pipe, root)
		c.walk(n.List, root)
		c.walk(n.ElseList, root)
	case *parse.WithNode:
		c.actions = true
		c.walk(n.Pipe, root)
		c.walk(n.List, false)
		c.walk(n.ElseList, root)
	case *parse.RangeNode:
		c.actions = true
		if !rangesOverTags(n.Pipe, root) || c.inRange {
			c.fail("{{range}} is only supported over .Tags, and not nested")
			return
		}
		c.walk(n.Pipe, root)
		c.inRange = true
		c.walk(n.List, false)
		c.inRange = false
		c.walk(n.ElseList, root)
	case *parse.BreakNode, *parse.ContinueNode:
	case *parse.TemplateNode:
		c.fail("{{template}} is not supported")
	case *parse.PipeNode:
		if n == nil {
			return
		}
		for _, cmd := range n.Cmds {
			c.walk(cmd, root)
		}
	case *parse.CommandNode:
		c.checkRegexpLiteral(n)
		for _, a := range n.Args {
			c.walk(a, root)
		}
	case *parse.FieldNode:
		if root {
			c.field(n.Ident)
		}
	case *parse.VariableNode:
		if n.Ident[0] == "$" {
			if len(n.Ident) == 1 {
				c.system = true // all of the metadata
			} else {
				c.field(n.Ident[1:])
			}
		}
	case *parse.DotNode:
		if root {
			c.system = true // all of the metadata
		}
	case *parse.ChainNode:
		if _, dot := n.Node.(*parse.DotNode); dot && root {
			c.field(n.Field)
			return
		}
		c.walk(n.Node, root)
	}
}

// field checks a reference .A.B... to the Metadata.
func (c *checker) field(ident []string) {
	name := ident[0]
	if name == "Tags" {
		if len(ident) > 2 {
			c.fail(".%s: a tag value is a string", strings.Join(ident, "."))
		}
		return
	}
	f, ok := fieldsByGoName[name]
	if !ok {
		hint := ""
		for goName := range fieldsByGoName {
			if strings.EqualFold(goName, name) {
				hint = fmt.Sprintf(" (did you mean .%s?)", goName)
			}
		}
		if strings.EqualFold(name, "tags") {
			hint = " (did you mean .Tags?)"
		}
		c.fail("unknown metadata field .%s%s; fields are %s", name, hint, templateFields())
		return
	}
	if len(ident) > 1 {
		c.fail(".%s: %s has no fields", strings.Join(ident, "."), name)
	}
	if f.system {
		c.system = true
	}
}

func (c *checker) checkRegexpLiteral(n *parse.CommandNode) {
	if len(n.Args) < 2 {
		return
	}
	fn, ok := n.Args[0].(*parse.IdentifierNode)
	if !ok || !regexpFuncs[fn.Ident] {
		return
	}
	if s, ok := n.Args[1].(*parse.StringNode); ok {
		if _, err := regexp.Compile(s.Text); err != nil {
			c.fail("%s: invalid regexp %q: %v", fn.Ident, s.Text, err)
		}
	}
}

// rangesOverTags reports whether a range pipeline is exactly .Tags (or
// $.Tags): ranging over anything else could run unbounded.
func rangesOverTags(p *parse.PipeNode, root bool) bool {
	if p == nil || len(p.Cmds) != 1 || len(p.Cmds[0].Args) != 1 {
		return false
	}
	switch a := p.Cmds[0].Args[0].(type) {
	case *parse.FieldNode:
		return root && len(a.Ident) == 1 && a.Ident[0] == "Tags"
	case *parse.VariableNode:
		return len(a.Ident) == 2 && a.Ident[0] == "$" && a.Ident[1] == "Tags"
	}
	return false
}

func templateFields() string {
	names := make([]string, 0, len(fields)+1)
	for _, f := range fields {
		names = append(names, "."+f.goName)
	}
	return strings.Join(append(names, ".Tags"), ", ")
}
