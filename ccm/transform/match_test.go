package transform

import (
	"fmt"
	"strings"
	"testing"
)

// sample is the metadata most tests evaluate against.
var sample = Metadata{
	Platform:     "metal",
	Hostname:     "web-42-fra",
	Region:       "eu-central",
	Zone:         "fra1",
	InstanceType: "c3.large",
	InstanceID:   "1234",
	ProviderID:   "talos://metal/10.0.0.5",
	Spot:         true,
	InternalDNS:  "web-42-fra.internal",
	Tags:         map[string]string{"env": "prod", "Team": "", "cores": "16"},
	Manufacturer: "Supermicro",
	ProductName:  "SYS-510T",
	SerialNumber: "S123",
	UUID:         "4c4c4544-0000",
}

// mustParse parses a configuration that is expected to be valid.
func mustParse(t *testing.T, doc string) *Config {
	t.Helper()
	c, err := Parse([]byte(doc), "test.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

// oneExpression builds a configuration with one rule of one expression.
func oneExpression(key string, op Operator, values ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "transformations:\n  - name: r\n    nodeSelector:\n      - matchExpressions:\n          - key: %q\n            operator: %s\n", key, op)
	if len(values) > 0 {
		b.WriteString("            values:\n")
		for _, v := range values {
			fmt.Fprintf(&b, "              - %q\n", v)
		}
	}
	return b.String()
}

func TestOperators(t *testing.T) {
	tests := []struct {
		name   string    // what is tested
		key    string    // expression key, as a user writes it
		op     Operator  // expression operator
		values []string  // expression values
		md     *Metadata // metadata to match; nil: sample
		want   bool      // whether the rule matches
	}{
		{name: "In matches", key: "platform", op: OpIn, values: []string{"aws", "metal"}, want: true},
		{name: "In does not match", key: "platform", op: OpIn, values: []string{"aws"}, want: false},
		{name: "In is case-sensitive on values", key: "platform", op: OpIn, values: []string{"METAL"}, want: false},
		{name: "keys are case-insensitive", key: "PLATFORM", op: OpIn, values: []string{"metal"}, want: true},
		{name: "camel-case key in any case", key: "instancetype", op: OpIn, values: []string{"c3.large"}, want: true},
		{name: "Talos spelling instanceId", key: "instanceId", op: OpIn, values: []string{"1234"}, want: true},
		{name: "In on an absent field is false", key: "externalDNS", op: OpIn, values: []string{""}, want: false},
		{name: "NotIn matches", key: "zone", op: OpNotIn, values: []string{"fra2"}, want: true},
		{name: "NotIn does not match", key: "zone", op: OpNotIn, values: []string{"fra1", "fra2"}, want: false},
		{name: "NotIn on an absent field is false", key: "externalDNS", op: OpNotIn, values: []string{"x"}, want: false},
		{name: "Exists on a set field", key: "internalDNS", op: OpExists, want: true},
		{name: "Exists on an empty field", key: "externalDNS", op: OpExists, want: false},
		{name: "spot always exists", key: "spot", op: OpExists, md: &Metadata{}, want: true},
		{name: "spot In false", key: "spot", op: OpIn, values: []string{"false"}, md: &Metadata{}, want: true},
		{name: "spot In true", key: "spot", op: OpIn, values: []string{"true"}, want: true},
		{name: "DoesNotExist on an empty field", key: "externalDNS", op: OpDoesNotExist, want: true},
		{name: "DoesNotExist on a set field", key: "region", op: OpDoesNotExist, want: false},
		{name: "tag In", key: "tags.env", op: OpIn, values: []string{"prod"}, want: true},
		{name: "tags prefix is case-insensitive", key: "Tags.env", op: OpIn, values: []string{"prod"}, want: true},
		{name: "tag names are case-sensitive", key: "tags.ENV", op: OpExists, want: false},
		{name: "empty tag exists", key: "tags.Team", op: OpExists, want: true},
		{name: "missing tag DoesNotExist", key: "tags.owner", op: OpDoesNotExist, want: true},
		{name: "tags on nil map", key: "tags.env", op: OpDoesNotExist, md: &Metadata{}, want: true},
		{name: "Gt true", key: "tags.cores", op: OpGt, values: []string{"8"}, want: true},
		{name: "Gt false when equal", key: "tags.cores", op: OpGt, values: []string{"16"}, want: false},
		{name: "Lt true", key: "instanceID", op: OpLt, values: []string{"2000"}, want: true},
		{name: "Lt false", key: "instanceID", op: OpLt, values: []string{"-5"}, want: false},
		{name: "Gt negative bound", key: "instanceID", op: OpGt, values: []string{"-5"}, want: true},
		{name: "Gt on a non-integer value is false, not an error", key: "hostname", op: OpGt, values: []string{"1"}, want: false},
		{name: "Lt on a non-integer value is false", key: "hostname", op: OpLt, values: []string{"1"}, want: false},
		{name: "Gt on an overflowing value is false", key: "instanceID", op: OpGt, values: []string{"1"}, md: &Metadata{InstanceID: "99999999999999999999"}, want: false},
		{name: "Gt on an absent field is false", key: "externalDNS", op: OpGt, values: []string{"1"}, want: false},
		{name: "Regexp matches", key: "hostname", op: OpRegexp, values: []string{`^web-\d+-`}, want: true},
		{name: "Regexp is unanchored", key: "hostname", op: OpRegexp, values: []string{`42`}, want: true},
		{name: "Regexp any of the values", key: "hostname", op: OpRegexp, values: []string{`^db-`, `fra$`}, want: true},
		{name: "Regexp none of the values", key: "hostname", op: OpRegexp, values: []string{`^db-`, `^lb-`}, want: false},
		{name: "Regexp on SystemInformation", key: "manufacturer", op: OpRegexp, values: []string{`(?i)supermicro`}, want: true},
		{name: "Regexp on an absent field is false even if it matches empty", key: "externalDNS", op: OpRegexp, values: []string{`.*`}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, oneExpression(tt.key, tt.op, tt.values...))
			md := sample
			if tt.md != nil {
				md = *tt.md
			}
			res, err := c.Apply(md)
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if got := len(res.Matched) == 1; got != tt.want {
				t.Errorf("matched = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSelectorLogic(t *testing.T) {
	const doc = `
transformations:
  - name: or-of-ands
    nodeSelector:
      - matchExpressions:   # metal AND web-*
          - {key: platform, operator: In, values: [metal]}
          - {key: hostname, operator: Regexp, values: ["^web-"]}
      - matchExpressions:   # OR hcloud
          - {key: platform, operator: In, values: [hcloud]}
  - name: everyone
`
	c := mustParse(t, doc)
	tests := []struct {
		name string   // case
		md   Metadata // node metadata
		want []string // rules expected to match, in order
		term int      // the term of or-of-ands that matched (-1: none)
	}{
		{name: "first term", md: Metadata{Platform: "metal", Hostname: "web-1"}, want: []string{"or-of-ands", "everyone"}, term: 0},
		{name: "second term", md: Metadata{Platform: "hcloud", Hostname: "db-1"}, want: []string{"or-of-ands", "everyone"}, term: 1},
		{name: "one expression of the first term fails", md: Metadata{Platform: "metal", Hostname: "db-1"}, want: []string{"everyone"}, term: -1},
		{name: "nothing", md: Metadata{Platform: "aws"}, want: []string{"everyone"}, term: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex, err := c.Explain(tt.md)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(ex.Result.Matched) != fmt.Sprint(tt.want) {
				t.Errorf("Matched = %v, want %v", ex.Result.Matched, tt.want)
			}
			if ex.Rules[0].Term != tt.term {
				t.Errorf("Term = %d, want %d", ex.Rules[0].Term, tt.term)
			}
			if ex.Rules[1].Term != -1 || !ex.Rules[1].Matched {
				t.Errorf("rule without selector: %+v, want matched with term -1", ex.Rules[1])
			}
		})
	}
}

func TestExplainMisses(t *testing.T) {
	const doc = `
transformations:
  - name: web
    nodeSelector:
      - matchExpressions:
          - {key: platform, operator: In, values: [metal]}
          - {key: hostname, operator: Regexp, values: ["^web-"]}
      - matchExpressions:
          - {key: zone, operator: Exists}
      - matchExpressions:
          - {key: tags.cores, operator: Gt, values: ["64"]}
`
	ex, err := mustParse(t, doc).Explain(Metadata{Platform: "metal", Hostname: "db-1", Tags: map[string]string{"cores": "many"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`nodeSelector[0].matchExpressions[1]: hostname "db-1" matches none of ["^web-"]`,
		`nodeSelector[1].matchExpressions[0]: zone is absent`,
		`nodeSelector[2].matchExpressions[0]: tags.cores "many" is not an integer`,
	}
	if got := ex.Rules[0].Misses; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Misses =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if ex.Rules[0].Matched || ex.Rules[0].Name != "web" {
		t.Errorf("outcome = %+v", ex.Rules[0])
	}
}

func TestMetadataSet(t *testing.T) {
	tests := []struct {
		key, value string   // Set arguments
		want       Metadata // result on an empty Metadata
		err        string   // part of the error; "" for none
	}{
		{key: "platform", value: "aws", want: Metadata{Platform: "aws"}},
		{key: "instanceId", value: "i-1", want: Metadata{InstanceID: "i-1"}},
		{key: "SERIALNUMBER", value: "S1", want: Metadata{SerialNumber: "S1"}},
		{key: "spot", value: "true", want: Metadata{Spot: true}},
		{key: "tags.team", value: "infra", want: Metadata{Tags: map[string]string{"team": "infra"}}},
		{key: "spot", value: "maybe", err: "spot must render to true or false"},
		{key: "colour", value: "red", err: `unknown metadata key "colour"`},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			var md Metadata
			err := md.Set(tt.key, tt.value)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || fmt.Sprint(md) != fmt.Sprint(tt.want) {
				t.Errorf("Set: %+v, %v; want %+v", md, err, tt.want)
			}
		})
	}
}
