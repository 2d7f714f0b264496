package options

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

// chartProfileDir is where the ccm-coordinator chart mounts its
// profileOverrides (--profile-overrides).
const chartProfileDir = "/etc/hybrid-ccm/profiles"

// coordinatorArgs returns the args of every ccm-coordinator container of the
// Deployments in a multi-document YAML manifest.
func coordinatorArgs(t *testing.T, manifest []byte) [][]string {
	t.Helper()
	var found [][]string
	dec := yaml.NewDecoder(bytes.NewReader(manifest))
	for {
		var obj struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name string   `yaml:"name"`
							Args []string `yaml:"args"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return found
		}
		if err != nil {
			t.Fatal(err)
		}
		if obj.Kind != "Deployment" {
			continue
		}
		for _, c := range obj.Spec.Template.Spec.Containers {
			if c.Name == "ccm-coordinator" {
				found = append(found, c.Args)
			}
		}
	}
}

// parseChartArgs parses args as the command does and validates them, with
// the chart's profile overrides mount (not on this machine) standing for an
// empty directory.
func parseChartArgs(t *testing.T, args []string) *Options {
	t.Helper()
	o, _ := parsed(t, args...)
	if o.ProfileOverrides != "" {
		if o.ProfileOverrides != chartProfileDir {
			t.Errorf("--profile-overrides=%s, want the chart's mount %s", o.ProfileOverrides, chartProfileDir)
		}
		o.ProfileOverrides = t.TempDir()
	}
	if err := o.Validate(); err != nil {
		t.Errorf("%q: %v", args, err)
	}
	if _, err := o.Config(""); err != nil {
		t.Errorf("%q: %v", args, err)
	}
	return o
}

// TestRenderedArgs: the args the charts render, in the manifests the docs
// apply (docs/deploy) and the charts' golden files, parse and validate; with
// the chart's default values they are the flags' defaults, but for leader
// election, which the chart turns on.
func TestRenderedArgs(t *testing.T) {
	files := []string{filepath.Join("..", "..", "docs", "deploy", "ccm-coordinator.yaml")}
	golden, err := filepath.Glob(filepath.Join("..", "..", "charts", "test", "testdata", "golden", "*", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, golden...)
	seen := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, args := range coordinatorArgs(t, data) {
			seen++
			t.Run(filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), func(t *testing.T) {
				o := parseChartArgs(t, args)
				if !strings.HasSuffix(filepath.Base(f), "default.yaml") && !strings.Contains(f, "deploy") {
					return
				}
				want, _ := parsed(t, "--enable-leader-election")
				if o.ReleaseNamespace != want.ReleaseNamespace || o.UninstallGracePeriod != want.UninstallGracePeriod ||
					o.Interval != want.Interval || o.WaitInterval != want.WaitInterval || o.HelmWait != want.HelmWait ||
					o.HelmTimeout != want.HelmTimeout || o.Concurrent != want.Concurrent || o.Log != want.Log ||
					o.LeaderElection != want.LeaderElection {
					t.Errorf("the chart's defaults %q are not the flags':\n%+v\n%+v", args, o, want)
				}
			})
		}
	}
	// docs/deploy, ccm-coordinator's two and hybrid-ccm's two
	if seen < 5 {
		t.Errorf("found %d ccm-coordinator containers in %v, want 5 at least", seen, files)
	}
}

// TestChartEveryArg renders the ccm-coordinator chart with every value that
// adds a flag and parses what it renders: each flag the template can pass
// is there, and means what the values say.
func TestChartEveryArg(t *testing.T) {
	dir := filepath.Join("..", "..", "charts", "ccm-coordinator")
	tmpl, err := os.ReadFile(filepath.Join(dir, "templates", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var templated []string
	for _, m := range regexp.MustCompile(`"?(--[a-z0-9-]+)=`).FindAllStringSubmatch(string(tmpl), -1) {
		templated = append(templated, m[1])
	}

	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.ReleaseName, in.Namespace = "ccm-coordinator", "kube-system"
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.KubeVersion = &chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}
	rel, err := in.Run(ch, map[string]any{
		"namespace": "ccm-system",
		"coordinator": map[string]any{
			"uninstallGracePeriod": "1h30m", "interval": "5m", "waitInterval": "10s", "helmWait": false,
			"helmTimeout": "2m", "concurrent": 2, "logLevel": "debug", "eventsAddr": "http://events.example:9090/",
		},
		"leaderElection":   map[string]any{"enabled": false},
		"gate":             map[string]any{"image": map[string]any{"repository": "registry.example/gate", "tag": "v2", "pullPolicy": "Always"}, "domainLabels": []any{"example.com/zone", "example.com/account"}},
		"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
		"global":           map[string]any{"imagePullSecrets": []any{map[string]any{"name": "shared"}}},
		"nativeCCMNetworkPolicy": map[string]any{"enabled": true,
			"apiServer": map[string]any{"cidrs": []any{"10.0.0.0/24", "fd00::/64"}, "ports": []any{6443, 443}},
			"cloudAPI":  map[string]any{"cidrs": []any{"203.0.113.0/24"}, "ports": []any{443}},
		},
		"profileOverrides": map[string]any{"hcloud.yaml": map[string]any{"name": "hcloud", "ccm": map[string]any{"image": map[string]any{"tag": "v9.9.9"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	all := coordinatorArgs(t, []byte(rel.Manifest))
	if len(all) != 1 {
		t.Fatalf("%d ccm-coordinator containers rendered, want 1", len(all))
	}
	args := all[0]
	for _, f := range templated {
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, f+"=") }) {
			t.Errorf("the template passes %s, not rendered with every value set: %q", f, args)
		}
	}
	o := parseChartArgs(t, args)
	if o.ReleaseNamespace != "ccm-system" || o.UninstallGracePeriod != 90*time.Minute || o.Interval != 5*time.Minute ||
		o.WaitInterval != 10*time.Second || o.HelmWait || o.HelmTimeout != 2*time.Minute || o.Concurrent != 2 ||
		o.Log.LogLevel != "debug" || o.LeaderElection.Enable || o.EventsAddr != "http://events.example:9090/" ||
		o.GateImage != "registry.example/gate:v2" || o.GateImagePullPolicy != "Always" ||
		!slices.Equal(o.DomainLabels, []string{"example.com/zone", "example.com/account"}) ||
		!slices.Equal(o.ImagePullSecrets, []string{"shared", "regcred"}) || !o.NetworkPolicy ||
		!slices.Equal(o.APIServerCIDRs, []string{"10.0.0.0/24", "fd00::/64"}) || !slices.Equal(o.APIServerPorts, []int32{6443, 443}) ||
		!slices.Equal(o.CloudAPICIDRs, []string{"203.0.113.0/24"}) || !slices.Equal(o.CloudAPIPorts, []int32{443}) {
		t.Errorf("rendered %q, parsed %+v", args, o)
	}
}
