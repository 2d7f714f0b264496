package doccommands

import (
	"slices"
	"strings"
	"testing"
)

func TestExtractDoc(t *testing.T) {
	tests := []struct {
		name  string            // case
		doc   string            // the document
		want  []string          // commands, as Command.Text
		lines []int             // their lines (nil: not checked)
		named map[string]string // named yaml and ini blocks (nil: none)
		err   string            // part of the error ("" none)
	}{
		{
			name: "continuations joined, comments and blank runs dropped",
			doc: "text\n```sh\nhelm upgrade x charts/x -n kube-system --reuse-values \\\n" +
				"  --set a=true        # ... for every cloud\n\n# a comment line\nkubectl get nativeccms   # wait\n```\n",
			want:  []string{"helm upgrade x charts/x -n kube-system --reuse-values --set a=true", "kubectl get nativeccms"},
			lines: []int{3, 7},
		},
		{
			name: "an indented block in a list item",
			doc:  "1. Do:\n\n   ```bash\n   kubectl -n ns create secret generic s --from-literal=token=\"$T\" \\\n     --dry-run=client -o yaml > f.yaml\n   ```\n",
			want: []string{`kubectl -n ns create secret generic s --from-literal=token="$T" --dry-run=client -o yaml > f.yaml`},
		},
		{
			name: "quotes keep a # and their blanks",
			doc:  "```sh\necho 'a  #b' \"c  d\" # gone\n```\n",
			want: []string{`echo 'a  #b' "c  d"`},
		},
		{
			name: "console: only $ lines are commands",
			doc:  "```console\n$ hybridctl version\nclient  0.1.0\n$ make \\\n  lint\n```\n",
			want: []string{"hybridctl version", "make lint"},
		},
		{
			name:  "other blocks are not shell",
			doc:   "```\nhelm install x\n```\n```yaml\n# clouds.yaml\nclouds: {}\n```\n```ini\nhelm=1\n```\n",
			named: map[string]string{"clouds.yaml": "# clouds.yaml\nclouds: {}\n"},
		},
		{
			name:  "a named yaml block with a note after the name",
			doc:   "  ```yaml\n  # p.patch.yaml — every node\n  machine: {}\n  ```\n",
			named: map[string]string{"p.patch.yaml": "# p.patch.yaml — every node\nmachine: {}\n"},
		},
		{
			name:  "a named ini block; an ini block without a name and a .conf yaml block are not",
			doc:   "   ```ini\n   # cloud.conf\n   [Global]\n   Region = eu-west-1\n   ```\n```ini\n[Global]\n```\n```yaml\n# x.conf\n```\n",
			named: map[string]string{"cloud.conf": "# cloud.conf\n[Global]\nRegion = eu-west-1\n"},
		},
		{
			name: "a block ending in a continuation",
			doc:  "```sh\nmake \\\n```\n",
			err:  "continuation",
		},
		{
			name: "a block never closed",
			doc:  "```sh\nmake test\n",
			err:  "never closed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmds, named, err := extractDoc("doc.md", tt.doc)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one about %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			var lines []int
			for _, c := range cmds {
				got = append(got, c.Text)
				lines = append(lines, c.Line)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("commands\n got %q\nwant %q", got, tt.want)
			}
			if tt.lines != nil && !slices.Equal(lines, tt.lines) {
				t.Errorf("lines %v, want %v", lines, tt.lines)
			}
			if len(named) != len(tt.named) {
				t.Errorf("named yaml %q, want %q", named, tt.named)
			}
			for k, v := range tt.named {
				if named[k] != v {
					t.Errorf("named yaml %s: %q, want %q", k, named[k], v)
				}
			}
		})
	}
}
