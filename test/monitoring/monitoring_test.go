package monitoring

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/tsdb"
)

// The scenario's scrapes, loaded once for every test: one TSDB per timeline
// and the inventory of what the real components exported in both.
var (
	root      string
	inventory = Inventory{}
	dbs       = map[string]*tsdb.DB{}
	steps     = map[string]int{}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if root, err = RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "hybrid-ccm-monitoring-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	ctx := context.Background()
	// HYBRID_CCM_SCRAPES: reuse the scrapes of an earlier run (written by
	// test/e2e with the same variable); otherwise run the scenario now.
	dir := os.Getenv(ScrapesEnv)
	if _, err := os.Stat(filepath.Join(dir, "trouble")); dir == "" || err != nil {
		dir = filepath.Join(tmp, "scrapes")
		fmt.Fprintln(os.Stderr, "running test/e2e TestMonitoringScenario for the scrapes")
		if err := RunScenario(ctx, root, dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	for _, tl := range Timelines {
		db, n, err := OpenTimeline(ctx, dir, tl, filepath.Join(tmp, "tsdb"), inventory)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer db.Close()
		dbs[tl], steps[tl] = db, n
	}
	return m.Run()
}

// TestRulesUseWhatTheComponentsExport: every rule file loads with
// Prometheus' own rule parser, and every metric, label and matched value its
// expressions use is one the real components exported in the scenario.
func TestRulesUseWhatTheComponentsExport(t *testing.T) {
	for _, f := range RuleFiles {
		rgs, err := LoadRules(root, f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		n := 0
		for _, g := range rgs.Groups {
			for _, r := range g.Rules {
				n++
				missing, err := CheckExpr(inventory, r.Expr)
				if err != nil {
					t.Errorf("%s: %s: %v", f, r.Alert, err)
				}
				for _, m := range missing {
					t.Errorf("%s: %s uses %s, which no component exported", f, r.Alert, m)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no rules", f)
		}
	}
}

// TestPlainRuleFileHasTheChartsRules: docs/deploy/monitoring's rule file
// holds the charts' rules, no more, no fewer (make manifests writes it).
func TestPlainRuleFileHasTheChartsRules(t *testing.T) {
	var want []rulefmt.RuleGroup
	for _, f := range ChartRuleFiles {
		rgs, err := LoadRules(root, f)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, rgs.Groups...)
	}
	got, err := LoadRules(root, RuleFiles[2])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Groups) != fmt.Sprint(want) {
		t.Errorf("%s differs from the charts' rule files: run make manifests", RuleFiles[2])
	}
}

// expectation is what an alert must do on the scenario's timelines.
type expectation struct {
	// labels the firing alert must carry in trouble (a subset)
	labels map[string]string
	// since, if set, selects the series whose first appearance is the
	// trouble: the alert must fire exactly after steps (minutes) more
	since string
	after int
	// toEnd: it still fires at the timeline's last step (an absence alert:
	// its component stays down, and its series become absent)
	toEnd bool
	// silentAtEnd: it no longer fires at the last step, its component being
	// down though the trouble it reports is not over: why the absence
	// alerts exist
	silentAtEnd bool
}

// alerts: every alert of the charts, with what it fires on in trouble. In
// calm none may fire.
var alerts = map[string]expectation{
	"TalosCCMNodeUninitialized": {labels: map[string]string{"node": "trouble-stuck", "severity": "warning"},
		since: `talos_ccm_node_uninitialized{node="trouble-stuck"}`, after: 15, silentAtEnd: true},
	"TalosCCMTalosAPIUnreachable": {labels: map[string]string{"hop": "node", "cause": "refused", "severity": "warning"},
		since: `talos_ccm_talos_api_unreachable_nodes{hop="node", cause="refused"} == 1`, after: 10, silentAtEnd: true},
	// a counter's first increment (its series appears at 1) fires at once
	"TalosCCMCSRDenied": {labels: map[string]string{"reason": "IPAddressNotEstablished"},
		since: `talos_ccm_csr_decisions_total{decision="deny"}`},
	"TalosCCMLeaderChangeStorm": {},
	"TalosCCMIPAMExhausted": {labels: map[string]string{"pool": "10.203.0.0/29", "severity": "critical"},
		since: `talos_ccm_ipam_exhausted_total`},
	"TalosCCMIPAMPoolNearlyFull": {labels: map[string]string{"pool": "10.203.0.0/29"}},
	"NativeCCMNotReady": {labels: map[string]string{"name": "hcloud"},
		since: `gotk_reconcile_condition{kind="NativeCCM", name="hcloud", type="Ready", status="False"} == 1`, after: 15, silentAtEnd: true},
	"NativeCCMNoLeader": {labels: map[string]string{"name": "hcloud", "severity": "critical"},
		since: `gotk_reconcile_condition{kind="NativeCCM", name="hcloud", type="Healthy", status="False"} == 1`, after: 5, silentAtEnd: true},
	"NativeCCMFenceRefusedWrite": {labels: map[string]string{"policy_binding": "native-ccm-fence.hybridccm.io"},
		since: `apiserver_validating_admission_policy_check_total{policy="native-ccm-fence.hybridccm.io", enforcement_action="deny"}`},
	// the troubled run ends with talos-ccm and the coordinator stopped: their
	// scrapes fail (up 0), their own series go stale
	"TalosCCMDown": {labels: map[string]string{"severity": "critical"},
		since: `up{job="talos-ccm"} == 0`, after: 5, toEnd: true},
	"CCMCoordinatorDown": {labels: map[string]string{"severity": "warning"},
		since: `up{job="ccm-coordinator"} == 0`, after: 5, toEnd: true},
}

// firstStep is the first step of a timeline at which expr has a sample (-1: none).
func firstStep(t *testing.T, timeline, expr string) int {
	t.Helper()
	m, err := Range(context.Background(), NewEngine(), dbs[timeline], expr, Start, Start.Add(time.Duration(steps[timeline]-1)*Step), Step)
	if err != nil {
		t.Fatal(err)
	}
	first := -1
	for _, s := range m {
		for _, f := range s.Floats {
			if k := int(time.UnixMilli(f.T).Sub(Start) / Step); first < 0 || k < first {
				first = k
			}
		}
	}
	return first
}

// firing evaluates r over a timeline, a minute per step as a rule group
// would, and returns the firing alerts of the first step any fires at (-1:
// never).
func firing(t *testing.T, r rulefmt.Rule, timeline string) (int, []*rules.Alert) {
	t.Helper()
	k, fired, _ := evalAlert(t, r, timeline)
	return k, fired
}

// evalAlert is firing, and also whether the alert still fires at the
// timeline's last step.
func evalAlert(t *testing.T, r rulefmt.Rule, timeline string) (first int, fired []*rules.Alert, atEnd bool) {
	t.Helper()
	expr, err := Parser.ParseExpr(r.Expr)
	if err != nil {
		t.Fatal(err)
	}
	rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), time.Duration(r.KeepFiringFor),
		labels.FromMap(r.Labels), labels.FromMap(r.Annotations), labels.EmptyLabels(), "", false, promslog.NewNopLogger())
	query := rules.EngineQueryFunc(NewEngine(), dbs[timeline])
	ctx := context.Background()
	first = -1
	for k := range steps[timeline] {
		if _, err := rule.Eval(ctx, 0, Start.Add(time.Duration(k)*Step), query, nil, 0); err != nil {
			t.Fatalf("%s at step %d of %s: %v", r.Alert, k, timeline, err)
		}
		var now []*rules.Alert
		for _, a := range rule.ActiveAlerts() {
			if a.State == rules.StateFiring {
				now = append(now, a)
			}
		}
		if len(now) > 0 && first < 0 {
			first, fired = k, now
		}
		atEnd = len(now) > 0
	}
	return first, fired, atEnd
}

// TestAlertsOnTheScenario: every alert fires on the troubled timeline (not
// at its first step, before the trouble), with the labels that point at the
// cause and annotations that expand, and never on the calm one.
func TestAlertsOnTheScenario(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range ChartRuleFiles {
		rgs, err := LoadRules(root, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range rgs.Groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					continue
				}
				seen[r.Alert] = true
				t.Run(r.Alert, func(t *testing.T) {
					want, ok := alerts[r.Alert]
					if !ok {
						t.Fatalf("%s has no scenario: add it to alerts (and to test/e2e's TestMonitoringScenario)", r.Alert)
					}
					if k, fired := firing(t, r, "calm"); k >= 0 {
						t.Errorf("fires on the calm timeline at step %d: %v", k, fired[0].Labels)
					}
					k, fired, atEnd := evalAlert(t, r, "trouble")
					if want.toEnd && !atEnd {
						t.Errorf("no longer fires at the troubled timeline's last step")
					}
					if want.silentAtEnd && atEnd {
						t.Errorf("still fires at the troubled timeline's last step, its component stopped: the scenario no longer shows why the absence alerts are needed")
					}
					if k < 0 {
						t.Fatalf("never fires on the troubled timeline")
					}
					if k == 0 {
						t.Errorf("fires at the troubled timeline's first step, before any trouble")
					}
					match := slices.ContainsFunc(fired, func(a *rules.Alert) bool {
						for n, v := range want.labels {
							if a.Labels.Get(n) != v {
								return false
							}
						}
						return true
					})
					if !match {
						t.Errorf("fires without labels %v: %v", want.labels, fired[0].Labels)
					}
					for _, a := range fired {
						a.Annotations.Range(func(l labels.Label) {
							if strings.Contains(l.Value, "error expanding template") || strings.Contains(l.Value, "<no value>") {
								t.Errorf("annotation %s: %s", l.Name, l.Value)
							}
						})
					}
					if want.since != "" {
						if first := firstStep(t, "trouble", want.since); first < 0 || k != first+want.after {
							t.Errorf("fires at step %d; %s appears at step %d: want step %d", k, want.since, first, first+want.after)
						}
					}
					t.Logf("fires at step %d of %d: %v", k, steps["trouble"], fired[0].Labels)
				})
			}
		}
	}
	for name := range alerts {
		if !seen[name] {
			t.Errorf("alerts names %s, which no rule file has", name)
		}
	}
}

// TestDashboard: the dashboard is well-formed JSON with unique panel ids,
// every query parses, uses only what the components exported, and shows data
// on the troubled timeline.
func TestDashboard(t *testing.T) {
	d, err := LoadDashboard(root)
	if err != nil {
		t.Fatal(err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard without title or uid")
	}
	ids := map[int]string{}
	queries := 0
	e := NewEngine()
	end := Start.Add(time.Duration(steps["trouble"]-1) * Step)
	for _, p := range d.AllPanels() {
		if p.ID <= 0 {
			t.Errorf("panel %q has no id", p.Title)
		}
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			missing, err := CheckExpr(inventory, tg.Expr)
			if err != nil {
				t.Errorf("panel %q: %s: %v", p.Title, tg.Expr, err)
				continue
			}
			for _, m := range missing {
				t.Errorf("panel %q uses %s, which no component exported", p.Title, m)
			}
			m, err := Range(context.Background(), e, dbs["trouble"], tg.Expr, Start, end, Step)
			if err != nil {
				t.Errorf("panel %q: %v", p.Title, err)
				continue
			}
			data := false
			for _, s := range m {
				for _, f := range s.Floats {
					data = data || !math.IsNaN(f.F)
				}
			}
			if !data {
				t.Errorf("panel %q: %s shows nothing on the troubled timeline", p.Title, tg.Expr)
			}
		}
	}
	if queries == 0 {
		t.Error("dashboard without queries")
	}
}
