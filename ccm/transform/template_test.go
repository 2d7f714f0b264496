package transform

import (
	"errors"
	"strings"
	"testing"
)

func TestTemplateFunctions(t *testing.T) {
	tests := []struct {
		name string // function or feature
		tmpl string // annotation template
		want string // rendered value
	}{
		{name: "field", tmpl: `{{ .Hostname }}`, want: "web-42-fra"},
		{name: "bool field", tmpl: `{{ if .Spot }}spot{{ else }}on-demand{{ end }}`, want: "spot"},
		{name: "tag by field", tmpl: `{{ .Tags.env }}`, want: "prod"},
		{name: "tag by index", tmpl: `{{ index .Tags "env" }}`, want: "prod"},
		{name: "missing tag is empty, not <no value>", tmpl: `[{{ .Tags.nope }}]`, want: "[]"},
		{name: "range over tags", tmpl: `{{ range $k, $v := .Tags }}{{ $k }};{{ end }}`, want: "Team;cores;env;"},
		{name: "root variable inside with", tmpl: `{{ with .Zone }}{{ . }}@{{ $.Region }}{{ end }}`, want: "fra1@eu-central"},
		{name: "upper", tmpl: `{{ upper .Zone }}`, want: "FRA1"},
		{name: "lower", tmpl: `{{ lower "ABC" }}`, want: "abc"},
		{name: "trim", tmpl: `{{ trim "  x  " }}`, want: "x"},
		{name: "trimSuffix (string last)", tmpl: `{{ trimSuffix ".internal" .InternalDNS }}`, want: "web-42-fra"},
		{name: "trimSuffix in a pipeline", tmpl: `{{ .InternalDNS | trimSuffix ".internal" }}`, want: "web-42-fra"},
		{name: "trimPrefix", tmpl: `{{ .Hostname | trimPrefix "web-" }}`, want: "42-fra"},
		{name: "replace", tmpl: `{{ .Hostname | replace "-" "_" }}`, want: "web_42_fra"},
		{name: "regexFind", tmpl: `{{ regexFind "[0-9]+" .Hostname }}`, want: "42"},
		{name: "regexFind without match", tmpl: `[{{ regexFind "x+" .Hostname }}]`, want: "[]"},
		{name: "regexFindString submatch", tmpl: `{{ regexFindString "^web-([0-9]+)-(.*)$" .Hostname 2 }}`, want: "fra"},
		{name: "regexFindString index out of range", tmpl: `[{{ regexFindString "^web-([0-9]+)" .Hostname 5 }}]`, want: "[]"},
		{name: "regexFindString negative index", tmpl: `[{{ regexFindString "web" .Hostname -1 }}]`, want: "[]"},
		{name: "regexReplaceAll with expansion", tmpl: `{{ regexReplaceAll "a(x*)b" "-ab-axxb-" "${1}W" }}`, want: "-W-xxW-"},
		{name: "regexReplaceAll empty matches", tmpl: `{{ regexReplaceAll "x*" "abc" "-" }}`, want: "-a-b-c-"},
		{name: "contains", tmpl: `{{ contains "42" .Hostname }}`, want: "true"},
		{name: "hasPrefix", tmpl: `{{ hasPrefix "web-" .Hostname }}`, want: "true"},
		{name: "hasSuffix", tmpl: `{{ hasSuffix "ams" .Hostname }}`, want: "false"},
		{name: "b64enc", tmpl: `{{ b64enc "hello" }}`, want: "aGVsbG8="},
		{name: "b64dec", tmpl: `{{ b64dec "aGVsbG8=" }}`, want: "hello"},
		{name: "default on empty", tmpl: `{{ .ExternalDNS | default "none" }}`, want: "none"},
		{name: "default on set", tmpl: `{{ .Zone | default "none" }}`, want: "fra1"},
		{name: "coalesce", tmpl: `{{ coalesce .ExternalDNS .InternalDNS }}`, want: "web-42-fra.internal"},
		{name: "ternary", tmpl: `{{ ternary "spot" "on-demand" .Spot }}`, want: "spot"},
		{name: "empty", tmpl: `{{ empty .ExternalDNS }}`, want: "true"},
		{name: "getValue", tmpl: `{{ getValue "a=1;rack=r7;b" "rack" }}`, want: "r7"},
		{name: "getValue missing", tmpl: `[{{ getValue "a=1;b" "b" }}]`, want: "[]"},
		{name: "built-in printf", tmpl: `{{ printf "%s/%s" .Region .Zone }}`, want: "eu-central/fra1"},
		{name: "SystemInformation field", tmpl: `{{ .Manufacturer }}-{{ .SerialNumber }}`, want: "Supermicro-S123"},
		{name: "constant", tmpl: `plain text`, want: "plain text"},
		{name: "annotation is not trimmed", tmpl: ` {{ .Zone }} `, want: " fra1 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, "transformations:\n  - annotations:\n      example.com/v: '"+strings.ReplaceAll(tt.tmpl, "'", "''")+"'\n")
			res, err := c.Apply(sample)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if got := res.Annotations["example.com/v"]; got != tt.want {
				t.Errorf("rendered %q, want %q", got, tt.want)
			}
		})
	}
}

func TestTemplateRejectedAtParse(t *testing.T) {
	tests := []struct {
		name string // what is wrong
		tmpl string // label template
		want string // part of the error
	}{
		{name: "syntax", tmpl: `{{ .Hostname `, want: "invalid template"},
		{name: "unknown function", tmpl: `{{ frobnicate .Hostname }}`, want: `function "frobnicate" not defined`},
		{name: "unknown field", tmpl: `{{ .Hostnme }}`, want: "unknown metadata field .Hostnme"},
		{name: "field in wrong case", tmpl: `{{ .hostname }}`, want: "did you mean .Hostname?"},
		{name: "field of a string", tmpl: `{{ .Zone.Name }}`, want: ".Zone.Name: Zone has no fields"},
		{name: "root variable with unknown field", tmpl: `{{ with .Zone }}{{ $.Nope }}{{ end }}`, want: "unknown metadata field .Nope"},
		{name: "invalid literal regexp", tmpl: `{{ regexFind "(" .Hostname }}`, want: `regexFind: invalid regexp "("`},
		{name: "invalid literal regexp in a pipeline", tmpl: `{{ .Hostname | regexReplaceAll "[" "x" }}`, want: `invalid regexp "["`},
		{name: "range over an integer", tmpl: `{{ range 1000000000 }}{{ end }}`, want: "{{range}} is only supported over .Tags"},
		{name: "range over a variable", tmpl: `{{ $n := 5 }}{{ range $n }}{{ end }}`, want: "{{range}} is only supported"},
		{name: "nested range", tmpl: `{{ range .Tags }}{{ range $.Tags }}{{ end }}{{ end }}`, want: "not nested"},
		{name: "define", tmpl: `{{ define "x" }}a{{ end }}b`, want: "{{define}} and {{block}} are not supported"},
		{name: "template call", tmpl: `{{ template "x" }}`, want: "not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := "transformations:\n  - name: tpl\n    labels:\n      example.com/v: '" + strings.ReplaceAll(tt.tmpl, "'", "''") + "'\n"
			_, err := Parse([]byte(doc), "test.yaml")
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			for _, part := range []string{"test.yaml:4:", `transformations[0] "tpl"`, `labels["example.com/v"]`, tt.want} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error %q does not contain %q", err, part)
				}
			}
		})
	}
}

func TestRenderLimits(t *testing.T) {
	long := strings.Repeat("a", 20<<10)
	tests := []struct {
		name string   // case
		tmpl string   // annotation template
		md   Metadata // metadata
		want string   // part of the Apply error
		node bool     // the error is about the node, not a rule
	}{
		{name: "output over the cap", tmpl: `{{ .Hostname }}{{ .Hostname }}`, md: Metadata{Hostname: long}, want: "rendered value longer than"},
		{name: "replace that would explode", tmpl: `{{ replace "" .Hostname .Hostname }}`, md: Metadata{Hostname: strings.Repeat("a", 1000)}, want: "rendered value longer than"},
		{name: "regexReplaceAll that would explode", tmpl: `{{ regexReplaceAll "" .Hostname .Hostname }}`, md: Metadata{Hostname: strings.Repeat("a", 1000)}, want: "rendered value longer than"},
		{name: "metadata over the cap", tmpl: `x`, md: Metadata{Tags: map[string]string{"big": long + long + long + long}}, want: "bytes of metadata", node: true},
		{name: "function error", tmpl: `{{ b64dec .Hostname }}`, md: Metadata{Hostname: "%%%"}, want: "b64dec: illegal base64"},
		{name: "regexp from metadata", tmpl: `{{ regexFind .Hostname "x" }}`, md: Metadata{Hostname: "("}, want: `invalid regexp "("`},
		{name: "index out of range", tmpl: `{{ slice .Hostname 5 }}`, md: Metadata{Hostname: "ab"}, want: "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, "transformations:\n  - name: lim\n    annotations:\n      example.com/v: '"+tt.tmpl+"'\n")
			_, err := c.Apply(tt.md)
			if err == nil {
				t.Fatal("Apply succeeded, want an error")
			}
			var e *Error
			if !errors.As(err, &e) || e.Rule != `transformations[0] "lim"` && !tt.node {
				t.Errorf("error %v does not name the rule", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestNeedsSystemInformation(t *testing.T) {
	tests := []struct {
		name string // case
		doc  string // configuration
		want bool   // NeedsSystemInformation
	}{
		{name: "no rules", doc: ``, want: false},
		{name: "platform only", doc: oneExpression("platform", OpIn, "metal"), want: false},
		{name: "selector on manufacturer", doc: oneExpression("Manufacturer", OpExists), want: true},
		{name: "label template on serial", doc: "transformations:\n  - labels:\n      serial: '{{ .SerialNumber }}'\n", want: true},
		{name: "override template on UUID", doc: "transformations:\n  - platformMetadata:\n      instanceID: '{{ .UUID }}'\n", want: true},
		{name: "template passing all metadata", doc: "transformations:\n  - annotations:\n      a: '{{ printf \"%v\" . }}'\n", want: true},
		{name: "dot inside with is not the metadata", doc: "transformations:\n  - annotations:\n      a: '{{ with .Zone }}{{ . }}{{ end }}'\n", want: false},
		{name: "taint value", doc: "transformations:\n  - taints:\n      hw: '{{ .ProductName }}:NoSchedule'\n", want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustParse(t, tt.doc).NeedsSystemInformation(); got != tt.want {
				t.Errorf("NeedsSystemInformation = %v, want %v", got, tt.want)
			}
		})
	}
}
