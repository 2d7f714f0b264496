package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DocsYAML returns the yaml code block that follows the line starting with
// marker (an HTML comment, say) in docs/<file>, so that tests run what the
// docs show. Errors name the file and the marker.
func DocsYAML(file, marker string) (string, error) {
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "docs", file))
	if err != nil {
		return "", err
	}
	_, after, ok := strings.Cut(string(b), "\n"+marker)
	if !ok {
		return "", fmt.Errorf("docs/%s has no line starting with %q", file, marker)
	}
	_, after, ok = strings.Cut(after, "```yaml\n")
	block, _, closed := strings.Cut(after, "```")
	if !ok || !closed {
		return "", fmt.Errorf("docs/%s: no yaml block after %q", file, marker)
	}
	return block, nil
}
