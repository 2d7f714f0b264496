package charts_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

// The charts repeat lists that code owns, so that Helm can check values and
// readers see the choices. These tests fail when one side was changed and
// the other forgotten.

// TestTalosCCMSchemaOperatorsAreTheParsers: the operator enum of a rule's
// matchExpressions in charts/talos-ccm/values.schema.json is exactly the set
// of operators ccm/transform parses, and the parser accepts a rule with each
// of them.
func TestTalosCCMSchemaOperatorsAreTheParsers(t *testing.T) {
	var schema struct {
		Definitions struct {
			NodeSelectorTerm struct {
				Properties struct {
					MatchExpressions struct {
						Items struct {
							Properties struct {
								Operator struct {
									Enum []string `json:"enum"`
								} `json:"operator"`
							} `json:"properties"`
						} `json:"items"`
					} `json:"matchExpressions"`
				} `json:"properties"`
			} `json:"nodeSelectorTerm"`
		} `json:"definitions"`
	}
	file := filepath.Join(testenv.RepoRoot(), "charts", "talos-ccm", "values.schema.json")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	enum := schema.Definitions.NodeSelectorTerm.Properties.MatchExpressions.Items.Properties.Operator.Enum
	if len(enum) == 0 {
		t.Fatalf("%s: no enum at definitions.nodeSelectorTerm.properties.matchExpressions.items.properties.operator", file)
	}
	var parsed []string
	for _, op := range transform.Operators() {
		parsed = append(parsed, string(op))
	}
	missing, extra := difference(parsed, enum)
	for _, op := range missing {
		t.Errorf("the parser accepts operator %s, the chart's values.schema.json does not list it", op)
	}
	for _, op := range extra {
		t.Errorf("the chart's values.schema.json lists operator %s, the parser does not know it", op)
	}
	// Each listed operator is accepted in a rule, with no values or with one
	// value that is a string, an integer and a regular expression at once.
	for _, op := range enum {
		var errs []error
		for _, values := range []string{"", `, values: ["1"]`} {
			cfg := fmt.Sprintf(`transformations:
  - name: uses-%s
    nodeSelector:
      - matchExpressions:
          - {key: zone, operator: %s%s}
    labels: {example.com/x: "y"}
`, op, op, values)
			_, err := transform.Parse([]byte(cfg), "operator "+op)
			if err == nil {
				errs = nil
				break
			}
			errs = append(errs, err)
		}
		if errs != nil {
			t.Errorf("the parser rejects a rule with operator %s, with no values and with one:\n%v", op, errors.Join(errs...))
		}
	}
}

// TestCoordinatorBuiltinProfilesAreTheEmbeddedOnes: the clouds the umbrella
// chart offers by default name exactly the built-in profiles
// (profiles/*.yaml, embedded in the coordinator).
func TestCoordinatorBuiltinProfilesAreTheEmbeddedOnes(t *testing.T) {
	set, err := profile.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	builtin := set.Names()
	readValues := func(c chart) map[string]any {
		t.Helper()
		v, err := chartutil.ReadValuesFile(filepath.Join(testenv.RepoRoot(), "charts", string(c), "values.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return v.AsMap()
	}

	// builtinProfiles is gone from the ccm-coordinator chart's values: it never
	// selected anything (TestRemovedAndRenamedValues).
	if _, ok := readValues(ccmCoordinator)["builtinProfiles"]; ok {
		t.Error("charts/ccm-coordinator/values.yaml lists builtinProfiles again; the coordinator loads every built-in profile whatever it says")
	}

	clouds, ok := readValues(hybridCCM)["clouds"].(map[string]any)
	if !ok {
		t.Fatalf("charts/hybrid-ccm/values.yaml: clouds is not a map")
	}
	var keys []string
	for k := range clouds {
		keys = append(keys, k)
	}
	missing, extra := difference(builtin, keys)
	for _, p := range missing {
		t.Errorf("profile %s (%s) is built in, charts/hybrid-ccm/values.yaml offers no clouds.%s", p, set.File(p), p)
	}
	for _, p := range extra {
		t.Errorf("charts/hybrid-ccm/values.yaml offers clouds.%s, which no built-in profile backs", p)
	}
}

// difference returns what is in want but not in got, and what is in got but
// not in want, each sorted.
func difference(want, got []string) (missing, extra []string) {
	for _, w := range want {
		if !slices.Contains(got, w) {
			missing = append(missing, w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			extra = append(extra, g)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	return missing, extra
}
