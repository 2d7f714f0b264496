package doccommands

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hybrid-ccm/hybrid-ccm/test/testenv"
)

func repoRoot() string { return testenv.RepoRoot() }

// step is how TestDocCommandsRun runs one command of the docs.
type step struct {
	// inRepo runs it in the repository root (make); otherwise in the
	// world's working directory (a copy of charts/, docs/deploy/, ...).
	inRepo bool
	// subst are old, new pairs replaced in the command before it runs
	// (placeholders, registry.example.com); "{registry}" in new is the test
	// registry's host:port, "{work}" the world's working directory.
	subst []string
	// dryRun runs `make -n` for `make`: make prints the recipe, runs none of it.
	dryRun bool
	// fresh runs it against an API server of its own, started for it: a
	// cluster Helm never touched.
	fresh bool
	// before prepares the world (fixtures, files the command reads).
	before func(t *testing.T, w *world)
	// exec replaces running the command (go test lines: the packages and
	// patterns are checked); nil: bash runs it.
	exec func(t *testing.T, w *world, line string) string
	// check asserts what the command did (objects, releases, images), given
	// the command as run and its output.
	check func(t *testing.T, w *world, line, out string)
	// needs names an optional tool (cosign): the step is skipped, saying
	// so, when the world has none.
	needs string
}

func (s *step) do(t *testing.T, w *world, cmd string) {
	t.Helper()
	if s.needs != "" {
		if _, err := os.Stat(filepath.Join(w.bin, s.needs)); err != nil {
			t.Skipf("%s is not built here (make %s builds it)", s.needs, s.needs)
		}
	}
	line := cmd
	if len(s.subst) > 0 {
		pairs := make([]string, len(s.subst))
		for i, v := range s.subst {
			pairs[i] = strings.NewReplacer("{registry}", w.reg.Host(), "{work}", w.work).Replace(v)
		}
		line = strings.NewReplacer(pairs...).Replace(line)
	}
	if s.dryRun {
		rest, ok := strings.CutPrefix(line, "make ")
		if !ok {
			t.Fatalf("dry run of %q: not a make line", line)
		}
		line = "make -n " + rest
	}
	if s.fresh {
		w = w.freshCluster(t)
	}
	if s.before != nil {
		s.before(t, w)
	}
	dir := w.work
	if s.inRepo {
		dir = w.repo
	}
	var out string
	switch prev, ran := w.ran[line]; {
	case s.exec != nil:
		out = s.exec(t, w, line)
	case ran:
		t.Logf("$ %s\n(ran before, for another line of the docs)", line)
		out = prev
	default:
		start := time.Now()
		out = w.sh(t, dir, line)
		w.ran[line] = out
		t.Logf("$ %s   (%s)\n%s", line, time.Since(start).Round(time.Millisecond), tail(out, 40))
	}
	if s.check != nil {
		s.check(t, w, line, out)
	}
}

// TestDocCommandsRun runs every command of the table that runs here, in the
// table's order, against one world, and checks what each did.
func TestDocCommandsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds helm, kubectl and the images, starts an API server")
	}
	start := time.Now()
	cmds, named, err := Extract(repoRoot())
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	for _, c := range cmds {
		shown[c.Text] = true
	}
	w := newWorld(t, named)
	t.Logf("world ready in %s", time.Since(start).Round(time.Second))
	for _, e := range commands {
		if e.run == nil {
			continue
		}
		if !shown[e.cmd] {
			t.Errorf("%q: no doc shows it (TestEveryDocCommandInTable)", e.cmd)
			continue
		}
		if !t.Run(e.cmd, func(t *testing.T) { e.run.do(t, w, e.cmd) }) {
			t.Fatalf("stopped: the commands after %q build on it", e.cmd)
		}
	}
	t.Logf("ran the docs' commands in %s", time.Since(start).Round(time.Second))
}

// makeRecipe checks that make's (dry-run) output holds each part.
func makeRecipe(parts ...string) func(t *testing.T, w *world, line, out string) {
	return func(t *testing.T, w *world, line, out string) {
		t.Helper()
		for _, p := range parts {
			if !strings.Contains(out, p) {
				t.Errorf("%s: the recipe lacks %q:\n%s", line, p, out)
			}
		}
	}
}

// goTestNames checks a `go test` line without running it (make test runs
// every package): a KUBEBUILDER_ASSETS=$(script) prefix names an executable
// script, every package exists and has tests, a -run or -bench pattern
// matches a function of them, and a -fuzz pattern exactly one (go test
// -fuzz refuses more).
func goTestNames(t *testing.T, w *world, line string) string {
	t.Helper()
	words := shellWords(line)
	for len(words) > 0 && strings.Contains(words[0], "=") {
		if m := regexp.MustCompile(`^\w+=\$\(([^)]+)\)$`).FindStringSubmatch(words[0]); m != nil {
			if fi, err := os.Stat(filepath.Join(w.repo, m[1])); err != nil || fi.Mode()&0o111 == 0 {
				t.Errorf("%s: %s is no executable script of the repository", line, m[1])
			}
		}
		words = words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "test" {
		t.Fatalf("%s: not a go test line", line)
	}
	patterns := map[string]string{}
	var pkgs []string
	for i := 2; i < len(words); i++ {
		switch a := words[i]; {
		case strings.HasPrefix(a, "./"):
			pkgs = append(pkgs, a)
		case strings.HasPrefix(a, "-") && i+1 < len(words) && !strings.Contains(a, "="):
			patterns[strings.TrimLeft(a, "-")] = words[i+1]
			i++
		}
	}
	if len(pkgs) == 0 {
		t.Fatalf("%s: no package", line)
	}
	funcs := map[string][]string{} // Test, Benchmark, Fuzz -> names
	for _, p := range pkgs {
		out := goCmd(t, w.repo, "list", "-f", "{{.Dir}}|{{join .TestGoFiles \",\"}},{{join .XTestGoFiles \",\"}}", p)
		dir, files, _ := strings.Cut(strings.TrimSpace(out), "|")
		for _, f := range strings.Split(files, ",") {
			if f == "" {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, f), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv != nil {
					continue
				}
				for _, kind := range []string{"Test", "Benchmark", "Fuzz"} {
					if strings.HasPrefix(fd.Name.Name, kind) && fd.Name.Name != "TestMain" {
						funcs[kind] = append(funcs[kind], fd.Name.Name)
					}
				}
			}
		}
	}
	matching := func(kind, pattern string) []string {
		// go test matches the first element of a /-separated pattern
		// against top-level functions.
		first, _, _ := strings.Cut(pattern, "/")
		re, err := regexp.Compile(first)
		if err != nil {
			t.Fatalf("%s: -%s %q: %v", line, strings.ToLower(kind), pattern, err)
		}
		var m []string
		for _, n := range funcs[kind] {
			if re.MatchString(n) {
				m = append(m, n)
			}
		}
		return m
	}
	summary := fmt.Sprintf("%v: %d tests, %d benchmarks, %d fuzz targets", pkgs, len(funcs["Test"]), len(funcs["Benchmark"]), len(funcs["Fuzz"]))
	run, hasRun := patterns["run"]
	switch {
	case !hasRun && len(funcs["Test"]) == 0:
		t.Errorf("%s: %v has no tests", line, pkgs)
	case hasRun && run != "^$" && len(matching("Test", run)) == 0:
		t.Errorf("%s: -run %q matches no test of %v", line, run, pkgs)
	}
	if b, ok := patterns["bench"]; ok {
		m := matching("Benchmark", b)
		if len(m) == 0 {
			t.Errorf("%s: -bench %q matches no benchmark of %v (%v)", line, b, pkgs, funcs["Benchmark"])
		}
		summary += fmt.Sprintf("; -bench %s: %v", b, m)
	}
	if f, ok := patterns["fuzz"]; ok {
		m := matching("Fuzz", f)
		if len(m) != 1 {
			t.Errorf("%s: -fuzz %q matches %v of %v, want exactly one", line, f, m, funcs["Fuzz"])
		}
		summary += fmt.Sprintf("; -fuzz %s: %v", f, m)
	}
	t.Log(summary)
	return summary
}

// shellWords splits a command line at blanks outside quotes and removes the
// quotes (enough for the docs' go test lines: no escapes, no expansions but
// a leading $(...) kept as it is).
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	var quote rune
	in := false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
