package transform

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestOperatorsAreDocumented: the operator table of docs/transformations.md
// has one row per operator the parser accepts, in the same order, and the
// format's outline there lists the same operators. (The
// talos-ccm chart's values.schema.json is checked in charts/test.)
func TestOperatorsAreDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "transformations.md"))
	if err != nil {
		t.Fatal(err)
	}
	const heading = "\n### Operators\n"
	_, section, ok := strings.Cut(string(b), heading)
	if !ok {
		t.Fatalf("docs/transformations.md has no %q section", strings.TrimSpace(heading))
	}
	row := regexp.MustCompile("^\\| `([A-Za-z]+)` \\|")
	var documented []string
	inTable := false
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		if m := row.FindStringSubmatch(line); m != nil {
			documented = append(documented, m[1])
		}
	}
	var parsed []string
	for _, op := range Operators() {
		parsed = append(parsed, string(op))
	}
	if !slices.Equal(documented, parsed) {
		t.Errorf("docs/transformations.md documents the operators %q, the parser accepts %q", documented, parsed)
	}
	// the format's outline lists them too: "operator: In | NotIn | ..."
	outline := regexp.MustCompile(`(?m)^\s*operator: (\w+(?: \| \w+)+)`).FindStringSubmatch(string(b))
	if outline == nil {
		t.Fatal("docs/transformations.md has no outline line \"operator: In | NotIn | ...\"")
	}
	if got := strings.Split(outline[1], " | "); !slices.Equal(got, parsed) {
		t.Errorf("docs/transformations.md's outline lists the operators %q, the parser accepts %q", got, parsed)
	}
}
