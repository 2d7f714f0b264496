// Package monitoring checks the alerts and the dashboard the charts ship
// against what the real components export: it runs test/e2e's
// TestMonitoringScenario (the real talos-ccm, ccm-coordinator and API server),
// loads the scrapes it wrote into a Prometheus TSDB, one step of the scenario
// per minute, and evaluates rules and panels with Prometheus' own parser and
// engine.
//
// It is a module of its own: Prometheus' libraries require newer k8s.io
// modules than the product builds with, so nothing here imports the product
// and the product never imports this.
package monitoring

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/storage"
)

// ScrapesEnv is test/e2e's variable: the directory TestMonitoringScenario
// writes its scrapes to.
const ScrapesEnv = "HYBRID_CCM_SCRAPES"

// Timelines are the scenario's two runs.
var Timelines = []string{"calm", "trouble"}

// Start is the virtual time of a timeline's first scrape; Step is the
// virtual time between two scrapes (the real ones are a fraction of a second
// apart: the state they show is what a Prometheus scraping every minute
// would have seen if each step took a minute).
var (
	Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	Step  = time.Minute
)

// RepoRoot is the product's repository (two levels up from this module).
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; d != filepath.Dir(d); d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/hybrid-ccm/hybrid-ccm\n") {
			return d, nil
		}
	}
	return "", fmt.Errorf("no hybrid-ccm repository above %s", wd)
}

// RunScenario runs test/e2e's TestMonitoringScenario in the repository at
// root, writing its scrapes to dir. It needs what test/e2e needs
// (KUBEBUILDER_ASSETS).
func RunScenario(ctx context.Context, root, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-vet=off", "-timeout=20m", "-run", "^TestMonitoringScenario$", "./test/e2e/")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), ScrapesEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("test/e2e TestMonitoringScenario: %w\n%s", err, tail(string(out), 8000))
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// Scrape is one /metrics page of one target at one step.
type Scrape struct {
	Step          int
	Job, Instance string
	Path          string
	// Down: the scrape failed (the component was stopped); Path holds the
	// error instead of a page.
	Down bool
}

// Time is when the scrape happened in virtual time.
func (s Scrape) Time() time.Time { return Start.Add(time.Duration(s.Step) * Step) }

// ListScrapes lists a timeline's scrapes in step order (files
// <step>_<job>_<instance>.prom, as test/e2e names them, and
// <step>_<job>_<instance>.down for a scrape that failed).
func ListScrapes(dir, timeline string) ([]Scrape, error) {
	entries, err := os.ReadDir(filepath.Join(dir, timeline))
	if err != nil {
		return nil, err
	}
	var out []Scrape
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".prom")
		down := false
		if !ok {
			if name, down = strings.CutSuffix(e.Name(), ".down"); !down {
				continue
			}
		}
		parts := strings.SplitN(name, "_", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("%s: not <step>_<job>_<instance>.prom", e.Name())
		}
		step, err := strconv.Atoi(parts[0])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out = append(out, Scrape{Step: step, Job: parts[1], Instance: parts[2], Path: filepath.Join(dir, timeline, e.Name()), Down: down})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no scrapes in %s", filepath.Join(dir, timeline))
	}
	slices.SortStableFunc(out, func(a, b Scrape) int { return a.Step - b.Step })
	return out, nil
}

// Steps is the number of steps of a timeline.
func Steps(scrapes []Scrape) int { return scrapes[len(scrapes)-1].Step + 1 }

// Inventory is what the components exported: metric name -> label name ->
// the values seen.
type Inventory map[string]map[string]map[string]bool

func (inv Inventory) add(lbls labels.Labels) {
	name := lbls.Get(labels.MetricName)
	if inv[name] == nil {
		inv[name] = map[string]map[string]bool{}
	}
	lbls.Range(func(l labels.Label) {
		if l.Name == labels.MetricName {
			return
		}
		if inv[name][l.Name] == nil {
			inv[name][l.Name] = map[string]bool{}
		}
		inv[name][l.Name][l.Value] = true
	})
}

// Load appends the scrapes' samples to app at their virtual times, with the
// job and instance labels a Prometheus adds and its up series (1 for a
// scrape that succeeded; 0 for one that failed, whose target's series of its
// last successful scrape are then marked stale, as Prometheus marks them),
// and records every series in inv (nil: not recorded).
func Load(app storage.Appender, scrapes []Scrape, inv Inventory) error {
	st := labels.NewSymbolTable()
	last := map[string][]labels.Labels{} // job/instance -> series of its last successful scrape
	for _, s := range scrapes {
		ts := s.Time().UnixMilli()
		up := labels.FromStrings(labels.MetricName, "up", "job", s.Job, "instance", s.Instance)
		if inv != nil {
			inv.add(up)
		}
		target := s.Job + "/" + s.Instance
		if s.Down {
			if _, err := app.Append(0, up, ts, 0); err != nil {
				return fmt.Errorf("%s: up: %w", s.Path, err)
			}
			for _, lbls := range last[target] {
				if _, err := app.Append(0, lbls, ts, math.Float64frombits(value.StaleNaN)); err != nil {
					return fmt.Errorf("%s: %s: %w", s.Path, lbls, err)
				}
			}
			last[target] = nil
			continue
		}
		b, err := os.ReadFile(s.Path)
		if err != nil {
			return err
		}
		p, err := textparse.New(b, "text/plain; version=0.0.4", st, textparse.ParserOptions{})
		if err != nil {
			return fmt.Errorf("%s: %w", s.Path, err)
		}
		// what a Prometheus records for every successful scrape
		if _, err := app.Append(0, up, ts, 1); err != nil {
			return fmt.Errorf("%s: up: %w", s.Path, err)
		}
		last[target] = last[target][:0]
		for {
			et, err := p.Next()
			if err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return fmt.Errorf("%s: %w", s.Path, err)
			}
			if et != textparse.EntrySeries {
				continue
			}
			_, _, v := p.Series()
			var lbls labels.Labels
			p.Labels(&lbls)
			b := labels.NewBuilder(lbls)
			b.Set("job", s.Job)
			b.Set("instance", s.Instance)
			lbls = b.Labels()
			if inv != nil {
				inv.add(lbls)
			}
			last[target] = append(last[target], lbls)
			if _, err := app.Append(0, lbls, ts, v); err != nil {
				return fmt.Errorf("%s: %s: %w", s.Path, lbls, err)
			}
		}
	}
	return app.Commit()
}
