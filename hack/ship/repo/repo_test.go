package repo

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRoot(t *testing.T) {
	top := t.TempDir()
	deep := filepath.Join(top, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(deep)
	// No go.mod under top yet: Root answers one above it, or none.
	if got, err := Root(); err == nil && (got == top || got == deep || got == filepath.Dir(deep)) {
		t.Fatalf("Root() = %s, which holds no go.mod", got)
	}
	if err := os.WriteFile(filepath.Join(top, "go.mod"), []byte("module example.com/x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := Root(); err != nil || got != top {
		t.Fatalf("Root() = %q, %v from %s; want %s", got, err, deep, top)
	}
}
