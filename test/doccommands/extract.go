// Package doccommands runs the commands the documentation shows. It reads
// every shell code block of README.md, docs/*.md and gitops/README.md (Extract),
// and its test holds a table of every command found there: how the test runs
// it (helm against a real kube-apiserver, `make release` and skopeo against an
// OCI registry of its own, kubectl and hybridctl built here), or why it cannot
// run here and what covers it instead. A command the docs gain or change that
// the table lacks fails the test, and so does a table entry no doc shows any
// more.
//
// It runs the real CLIs, each built from source at a known version and cached
// outside the repository (helm from this module's go.mod, kubectl at the
// control plane's version by hack/kubectl.sh), or installed from Debian's
// packages (skopeo, hack/cluster-packages.sh). It never changes the
// repository but for `make images` and `make release` writing bin/images, as
// they do for a user.
package doccommands

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Command is one command line of a shell code block.
type Command struct {
	// File is the document's path relative to the repository root.
	File string
	// Line is the line of the document the command starts on.
	Line int
	// Text is the command normalized: `\` continuations joined, a trailing
	// comment dropped, every run of blanks outside quotes one space.
	Text string
}

func (c Command) String() string { return fmt.Sprintf("%s:%d: %s", c.File, c.Line, c.Text) }

// Docs are the documents whose commands are extracted, as globs relative to
// the repository root.
var Docs = []string{"README.md", "docs/*.md", "gitops/README.md"}

// shellFence opens a block of shell code; console blocks hold commands on
// lines starting with "$ " and their output on the others.
var shellFence = regexp.MustCompile("^```(sh|bash|shell|console)\\s*$")

// namedBlock is, per language, the first line of a block that names the
// file it shows: yaml ("# clouds.yaml", "# hybrid-ccm.patch.yaml — every
// node") and ini ("# cloud.conf"; `#` starts a comment in the INI files the
// CCMs read).
var namedBlock = map[string]*regexp.Regexp{
	"yaml": regexp.MustCompile(`^#\s+([A-Za-z0-9._-]+\.ya?ml)\b`),
	"ini":  regexp.MustCompile(`^#\s+([A-Za-z0-9._-]+\.conf)\b`),
}

// Extract returns the commands of every shell code block of the documents
// under root, in the order of Docs and of their lines, and the yaml and ini
// blocks that name a file (the docs' "# clouds.yaml", "# cloud.conf"), by
// that name.
func Extract(root string) ([]Command, map[string]string, error) {
	var files []string
	for _, g := range Docs {
		m, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			return nil, nil, err
		}
		sort.Strings(m)
		files = append(files, m...)
	}
	var cmds []Command
	named := map[string]string{}
	for _, f := range files {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			return nil, nil, err
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, err
		}
		c, y, err := extractDoc(rel, string(b))
		if err != nil {
			return nil, nil, err
		}
		cmds = append(cmds, c...)
		for k, v := range y {
			if _, dup := named[k]; dup {
				return nil, nil, fmt.Errorf("%s: a second block named %s", rel, k)
			}
			named[k] = v
		}
	}
	return cmds, named, nil
}

// extractDoc extracts the commands and named blocks of one document.
// Fenced blocks may be indented (inside a list item): the fence's
// indentation is removed from the block's lines.
func extractDoc(file, doc string) ([]Command, map[string]string, error) {
	var (
		cmds    []Command
		named   = map[string]string{}
		inBlock bool
		lang    string
		indent  string
		start   int
		body    []string
		// pending is a command continued with a trailing `\`.
		pending     []string
		pendingLine int
	)
	flush := func() {
		if len(pending) > 0 {
			if t := normalize(strings.Join(pending, " ")); t != "" {
				cmds = append(cmds, Command{File: file, Line: pendingLine, Text: t})
			}
			pending = nil
		}
	}
	sc := bufio.NewScanner(strings.NewReader(doc))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		raw := sc.Text()
		trimmed := strings.TrimLeft(raw, " \t")
		if !inBlock {
			if strings.HasPrefix(trimmed, "```") {
				inBlock, start, body = true, n, nil
				indent = raw[:len(raw)-len(trimmed)]
				lang = ""
				if m := shellFence.FindStringSubmatch(strings.TrimRight(trimmed, " \t")); m != nil {
					lang = m[1]
				} else if strings.HasPrefix(trimmed, "```yaml") {
					lang = "yaml"
				} else if strings.HasPrefix(trimmed, "```ini") {
					lang = "ini"
				}
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			if len(pending) > 0 {
				return nil, nil, fmt.Errorf("%s:%d: the block ends in a `\\` continuation", file, pendingLine)
			}
			if re := namedBlock[lang]; re != nil && len(body) > 0 {
				if m := re.FindStringSubmatch(body[0]); m != nil {
					if _, dup := named[m[1]]; dup {
						return nil, nil, fmt.Errorf("%s:%d: a second block named %s", file, start, m[1])
					}
					named[m[1]] = strings.Join(body, "\n") + "\n"
				}
			}
			inBlock = false
			continue
		}
		line := strings.TrimPrefix(raw, indent)
		body = append(body, line)
		switch lang {
		case "sh", "bash", "shell":
		case "console":
			if len(pending) == 0 {
				after, ok := strings.CutPrefix(line, "$ ")
				if !ok {
					continue // output
				}
				line = after
			}
		default:
			continue
		}
		if len(pending) == 0 {
			if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			pendingLine = n
		}
		// A `\` at the end of the line (before any comment) continues it.
		code := stripComment(line)
		if cont, ok := strings.CutSuffix(strings.TrimRight(code, " \t"), `\`); ok {
			pending = append(pending, cont)
			continue
		}
		pending = append(pending, code)
		flush()
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	if inBlock {
		return nil, nil, fmt.Errorf("%s:%d: a code block that is never closed", file, start)
	}
	return cmds, named, nil
}

// stripComment drops a shell comment: a `#` at the start of a word, outside
// quotes.
func stripComment(s string) string {
	var quote rune
	prev := ' '
	for i, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (prev == ' ' || prev == '\t'):
			return s[:i]
		}
		prev = r
	}
	return s
}

// normalize trims s and makes every run of blanks outside quotes one space.
func normalize(s string) string {
	var b strings.Builder
	var quote rune
	space := false
	for _, r := range strings.TrimSpace(s) {
		if quote == 0 && (r == ' ' || r == '\t') {
			space = true
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote == 0 && (r == '\'' || r == '"'):
			quote = r
		}
		b.WriteRune(r)
	}
	return b.String()
}
