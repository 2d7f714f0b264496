package doccommands

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// linkedDocs are the documents whose relative links TestDocLinks checks, as
// globs relative to the repository root: the docs of Docs, the changelog and
// the charts' READMEs.
var linkedDocs = []string{"README.md", "CHANGELOG.md", "docs/*.md", "gitops/README.md", "charts/*/README.md"}

var (
	// mdLink is an inline Markdown link or image: [text](target) or
	// [text](target "title").
	mdLink = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	// htmlAnchor is an explicit anchor: <a id="x"> or <a name="x">.
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	// headingLink is a link inside a heading: only its text counts for the slug.
	headingLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// TestDocLinks fails for a relative link of the docs whose file does not
// exist, or whose #anchor names no heading (as GitHub makes anchors from
// headings) or explicit anchor of the file it points to. Links to other
// sites are not followed.
func TestDocLinks(t *testing.T) {
	root := repoRoot()
	var files []string
	for _, g := range linkedDocs {
		m, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	sort.Strings(files)
	if len(files) < 20 {
		t.Fatalf("found %d documents for %v", len(files), linkedDocs)
	}
	anchors := map[string]map[string]bool{} // file -> anchors, read once
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := docAnchors(string(b))
		anchors[path] = a
		return a, nil
	}
	links := 0
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range docLines(string(b)) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				path, anchor, _ := strings.Cut(target, "#")
				dest := f
				if path != "" {
					dest = filepath.Join(filepath.Dir(f), path)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link %q: no file %s", rel, n+1, target, path)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				a, err := anchorsOf(dest)
				if err != nil {
					t.Errorf("%s:%d: link %q: %v", rel, n+1, target, err)
					continue
				}
				if !a[anchor] {
					t.Errorf("%s:%d: link %q: no heading or anchor #%s in %s", rel, n+1, target, anchor, filepath.Base(dest))
				}
			}
		}
	}
	if links < 100 {
		t.Errorf("checked %d relative links: the link pattern is broken", links)
	}
}

// docLines returns the lines of a Markdown document with the lines of fenced
// code blocks blanked, so that code is not read as links or headings.
func docLines(doc string) []string {
	lines := strings.Split(doc, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimLeft(l, " \t"), "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return lines
}

// docAnchors returns the anchors of a Markdown document: GitHub's slug of
// every heading (numbered -1, -2, ... when repeated) and every explicit
// <a id> or <a name>.
func docAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range docLines(doc) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		t := strings.TrimLeft(l, "#")
		if len(t) == len(l) || len(l)-len(t) > 6 || (t != "" && t[0] != ' ') {
			continue
		}
		s := slug(t)
		if k := seen[s]; k > 0 {
			out[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// slug is GitHub's anchor of a heading's text: links reduced to their text,
// lower case, letters, digits, '-' and '_' kept, spaces made '-', the rest
// dropped.
func slug(heading string) string {
	h := headingLink.ReplaceAllString(strings.TrimSpace(heading), "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Is it working? `helm test`":                              "is-it-working-helm-test",
		"1. Talos machine configuration":                          "1-talos-machine-configuration",
		"Domains: one native CCM per region, account or project":  "domains-one-native-ccm-per-region-account-or-project",
		"The view's code, and decoding with apimachinery instead": "the-views-code-and-decoding-with-apimachinery-instead",
		"Prerequisite: a path to every node's Talos API":          "prerequisite-a-path-to-every-nodes-talos-api",
		"cloudscale: routing by a transformation":                 "cloudscale-routing-by-a-transformation",
		"AWS: the IAM user and `cloud.conf`":                      "aws-the-iam-user-and-cloudconf",
		"node-csr-approval: a renewal storm beside 50 hung nodes": "node-csr-approval-a-renewal-storm-beside-50-hung-nodes",
		"From [the gate](gate.md) — a request's path":             "from-the-gate--a-requests-path",
		"At scale: 1,000, 5,000 and 10,000 nodes":                 "at-scale-1000-5000-and-10000-nodes",
		"ccm-coordinator: platform appears → native CCM deployed": "ccm-coordinator-platform-appears--native-ccm-deployed",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
