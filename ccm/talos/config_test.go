package talos_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/test/talosnode"
)

// isolate points every default talosconfig location into fresh directories:
// HOME (so ~/.talos/config), TALOS_HOME unset, TALOSCONFIG unset.
func isolate(t *testing.T) (home string) {
	t.Helper()
	home = t.TempDir()
	t.Setenv("HOME", home)
	for _, v := range []string{"TALOSCONFIG", "TALOS_HOME"} {
		t.Setenv(v, "")
		if err := os.Unsetenv(v); err != nil {
			t.Fatal(err)
		}
	}
	return home
}

// writeConfig writes a talosconfig of ep whose context is named name.
func writeConfig(t *testing.T, ep *talosnode.Endpoint, path, name string) {
	t.Helper()
	cfg, err := ep.ClientConfig("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts[name] = cfg.Contexts[cfg.Context]
	delete(cfg.Contexts, cfg.Context)
	cfg.Context = name
	b, err := cfg.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadConfigLocations(t *testing.T) {
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Stop()

	t.Run("none found: error names the paths, nothing is created", func(t *testing.T) {
		home := isolate(t)
		_, _, err := talos.LoadConfig("")
		if err == nil || !strings.Contains(err.Error(), filepath.Join(home, ".talos", "config")) ||
			!strings.Contains(err.Error(), "/var/run/secrets/talos.dev/config") {
			t.Fatalf("want an error naming the default paths, got %v", err)
		}
		if _, err := os.Stat(filepath.Join(home, ".talos")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("LoadConfig created %s/.talos (%v)", home, err)
		}
	})
	t.Run("default path ~/.talos/config", func(t *testing.T) {
		home := isolate(t)
		want := filepath.Join(home, ".talos", "config")
		writeConfig(t, ep, want, "from-home")
		cfg, path, err := talos.LoadConfig("")
		if err != nil || path != want || cfg.Context != "from-home" {
			t.Fatalf("got %q context %v, %v; want %s", path, ctxOf(cfg), err, want)
		}
	})
	t.Run("TALOSCONFIG comes before ~/.talos/config", func(t *testing.T) {
		home := isolate(t)
		writeConfig(t, ep, filepath.Join(home, ".talos", "config"), "from-home")
		env := filepath.Join(t.TempDir(), "env-talosconfig")
		writeConfig(t, ep, env, "from-env")
		t.Setenv("TALOSCONFIG", env)
		cfg, path, err := talos.LoadConfig("")
		if err != nil || path != env || cfg.Context != "from-env" {
			t.Fatalf("got %q context %v, %v; want %s", path, ctxOf(cfg), err, env)
		}
	})
	t.Run("an explicit path wins and must exist", func(t *testing.T) {
		home := isolate(t)
		writeConfig(t, ep, filepath.Join(home, ".talos", "config"), "from-home")
		explicit := filepath.Join(t.TempDir(), "explicit")
		writeConfig(t, ep, explicit, "explicit")
		t.Setenv("TALOSCONFIG", filepath.Join(home, ".talos", "config"))
		if cfg, path, err := talos.LoadConfig(explicit); err != nil || path != explicit || cfg.Context != "explicit" {
			t.Fatalf("got %q context %v, %v", path, ctxOf(cfg), err)
		}
		missing := filepath.Join(t.TempDir(), "missing")
		if _, _, err := talos.LoadConfig(missing); err == nil || !strings.Contains(err.Error(), missing) {
			t.Fatalf("missing explicit file: want an error naming it, got %v", err)
		}
		if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("LoadConfig created %s", missing)
		}
	})
	t.Run("a broken file is an error naming it", func(t *testing.T) {
		isolate(t)
		bad := filepath.Join(t.TempDir(), "bad")
		if err := os.WriteFile(bad, []byte("context: [x"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("TALOSCONFIG", bad)
		if _, _, err := talos.LoadConfig(""); err == nil || !strings.Contains(err.Error(), bad) {
			t.Fatalf("want an error naming %s, got %v", bad, err)
		}
	})
}

func ctxOf(cfg *clientconfig.Config) string {
	if cfg == nil {
		return ""
	}
	return cfg.Context
}

// Endpoints override the talosconfig's: a talosconfig whose endpoint is dead
// works when the real endpoint is given, and the talosconfig's context and
// certificate are still used.
func TestEndpointsOverride(t *testing.T) {
	isolate(t)
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Stop()
	if _, err := ep.AddNode("n1", []string{"10.4.0.1"}, talosnode.Spec{Metadata: &runtime.PlatformMetadataSpec{Platform: "metal"}}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "talosconfig")
	if err := ep.WriteClientConfig(path, "", "127.0.0.1:1"); err != nil { // nothing listens there
		t.Fatal(err)
	}
	t.Setenv("TALOSCONFIG", path) // found through the default lookup

	ctx := context.Background()
	dead, err := talos.New(ctx, talos.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dead.Close() }()
	if _, err := dead.PlatformMetadata(ctx, "10.4.0.1"); err == nil {
		t.Fatal("the talosconfig's dead endpoint answered")
	}
	if ep.Requests() != 0 {
		t.Fatalf("endpoint saw %d requests without the override", ep.Requests())
	}
	c, err := talos.New(ctx, talos.Options{Endpoints: []string{ep.Addr()}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if md, err := c.PlatformMetadata(ctx, "10.4.0.1"); err != nil || md.Platform != "metal" {
		t.Fatalf("with --talos-endpoints: %+v, %v", md, err)
	}
	if ep.Requests() != 1 {
		t.Fatalf("endpoint saw %d requests, want 1", ep.Requests())
	}
}

// ClusterName is the `cluster` of the talosconfig context in use (the one
// --talos-context names, else the current one), as the upstream Talos CCM
// reads it; "" when that context names none.
func TestClusterName(t *testing.T) {
	ep, err := talosnode.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Stop()
	cfg, err := ep.ClientConfig("")
	if err != nil {
		t.Fatal(err)
	}
	current := cfg.Context
	cfg.Contexts[current].Cluster = "prod-eu"
	other := *cfg.Contexts[current]
	other.Cluster = "staging"
	cfg.Contexts["other"] = &other
	bare := *cfg.Contexts[current]
	bare.Cluster = ""
	cfg.Contexts["bare"] = &bare
	path := filepath.Join(t.TempDir(), "talosconfig")
	if err := cfg.Save(path); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		context string // --talos-context
		want    string // ClusterName
	}{
		{context: "", want: "prod-eu"},
		{context: "other", want: "staging"},
		{context: "bare", want: ""},
	} {
		c, err := talos.New(context.Background(), talos.Options{ConfigPath: path, Context: tc.context, ReloadInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.ClusterName(); got != tc.want {
			t.Errorf("context %q: ClusterName %q, want %q", tc.context, got, tc.want)
		}
		_ = c.Close()
	}
}
