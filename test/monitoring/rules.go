package monitoring

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// RuleFiles are the rule files the charts ship (the one source of the
// alerts) and the plain file make manifests writes from them.
var RuleFiles = []string{
	"charts/talos-ccm/files/prometheus-rules.yaml",
	"charts/ccm-coordinator/files/prometheus-rules.yaml",
	"docs/deploy/monitoring/prometheus-rules.yaml",
}

// ChartRuleFiles are the sources among RuleFiles.
var ChartRuleFiles = RuleFiles[:2]

// Parser is PromQL as Prometheus parses it by default.
var Parser = parser.NewParser(parser.Options{})

// LoadRules parses a rule file with Prometheus' own loader (unknown fields
// are errors, every expression and template is checked).
func LoadRules(root, file string) (*rulefmt.RuleGroups, error) {
	rgs, errs := rulefmt.ParseFile(filepath.Join(root, file), false, model.UTF8Validation, Parser, promslog.NewNopLogger())
	if len(errs) > 0 {
		return nil, fmt.Errorf("%v", errs)
	}
	return rgs, nil
}

// CheckExpr reports every metric name, label name, or value of an equality
// matcher that expr uses and inv does not hold.
func CheckExpr(inv Inventory, expr string) ([]string, error) {
	e, err := Parser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, ms := range parser.ExtractSelectors(e) {
		var name string
		for _, m := range ms {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			missing = append(missing, fmt.Sprintf("a selector without a metric name: %v", ms))
			continue
		}
		lbls, ok := inv[name]
		if !ok {
			missing = append(missing, "metric "+name)
			continue
		}
		for _, m := range ms {
			if m.Name == labels.MetricName {
				continue
			}
			values, ok := lbls[m.Name]
			if !ok {
				missing = append(missing, fmt.Sprintf("label %s of %s", m.Name, name))
				continue
			}
			if m.Type == labels.MatchEqual && m.Value != "" && !values[m.Value] {
				have := make([]string, 0, len(values))
				for v := range values {
					have = append(have, v)
				}
				slices.Sort(have)
				missing = append(missing, fmt.Sprintf("%s{%s=%q} (seen: %v)", name, m.Name, m.Value, have))
			}
		}
	}
	return missing, nil
}
