package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// DashboardFile is the dashboard the hybrid-ccm chart ships (make manifests
// copies it to docs/deploy/monitoring).
const DashboardFile = "charts/hybrid-ccm/files/hybrid-ccm-dashboard.json"

// Dashboard is the part of Grafana's dashboard model this module reads.
type Dashboard struct {
	Title  string  `json:"title"`
	UID    string  `json:"uid"`
	Panels []Panel `json:"panels"`
}

// Panel is one panel (rows are panels of type "row").
type Panel struct {
	ID      int      `json:"id"`
	Type    string   `json:"type"`
	Title   string   `json:"title"`
	GridPos GridPos  `json:"gridPos"`
	Targets []Target `json:"targets"`
	Panels  []Panel  `json:"panels"` // a collapsed row's
	Field   struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

// GridPos is a panel's place on Grafana's 24-column grid.
type GridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

// Target is one query of a panel.
type Target struct {
	RefID        string `json:"refId"`
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
}

// LoadDashboard reads and decodes the dashboard; unknown top-level content
// is allowed (Grafana's model is large), malformed JSON is not.
func LoadDashboard(root string) (*Dashboard, error) {
	b, err := os.ReadFile(filepath.Join(root, DashboardFile))
	if err != nil {
		return nil, err
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%s: not valid JSON", DashboardFile)
	}
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	return &d, nil
}

// AllPanels is every panel, those inside collapsed rows too.
func (d *Dashboard) AllPanels() []Panel {
	var out []Panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}
