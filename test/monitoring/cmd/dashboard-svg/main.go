// Command dashboard-svg draws the Grafana dashboard the charts ship as an SVG
// picture, from a real run: it evaluates every panel's queries with
// Prometheus' engine over the scrapes of test/e2e's TestMonitoringScenario
// (the real talos-ccm, ccm-coordinator and API server; one scenario step per
// minute) and draws each panel's title and its lines or value. It is not
// Grafana: it draws the dashboard's layout, queries and legends, with its own
// plain style.
//
//	go run ./cmd/dashboard-svg -out ../../docs/images/dashboard.svg [-scrapes DIR] [-timeline trouble]
package main

import (
	"context"
	"flag"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/prometheus/promql"

	"github.com/hybrid-ccm/hybrid-ccm/test/monitoring"
)

func main() {
	out := flag.String("out", "", "SVG file to write")
	scrapes := flag.String("scrapes", "", "scrapes of an earlier TestMonitoringScenario run (default: run it now)")
	timeline := flag.String("timeline", "trouble", "timeline to draw (calm or trouble)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "dashboard-svg: -out is required")
		os.Exit(2)
	}
	if err := run(*out, *scrapes, *timeline); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard-svg:", err)
		os.Exit(1)
	}
}

func run(out, dir, timeline string) error {
	ctx := context.Background()
	root, err := monitoring.RepoRoot()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "dashboard-svg-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if dir == "" {
		dir = filepath.Join(tmp, "scrapes")
		fmt.Fprintln(os.Stderr, "running test/e2e TestMonitoringScenario for the scrapes")
		if err := monitoring.RunScenario(ctx, root, dir); err != nil {
			return err
		}
	}
	db, steps, err := monitoring.OpenTimeline(ctx, dir, timeline, filepath.Join(tmp, "tsdb"), nil)
	if err != nil {
		return err
	}
	defer db.Close()
	d, err := monitoring.LoadDashboard(root)
	if err != nil {
		return err
	}
	e := monitoring.NewEngine()
	end := monitoring.Start.Add(time.Duration(steps-1) * monitoring.Step)

	var svg strings.Builder
	maxY := 0
	for _, p := range d.AllPanels() {
		maxY = max(maxY, p.GridPos.Y+p.GridPos.H)
	}
	const header = 56
	height := header + maxY*rowPx + 16
	fmt.Fprintf(&svg, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n", width, height, width, height)
	fmt.Fprintf(&svg, `<rect width="%d" height="%d" fill="#f4f5f5"/>`+"\n", width, height)
	fmt.Fprintf(&svg, `<text x="12" y="26" font-size="18" fill="#222">%s</text>`+"\n", esc(d.Title))
	fmt.Fprintf(&svg, `<text x="12" y="46" font-size="11" fill="#666">%s</text>`+"\n",
		esc(fmt.Sprintf("Drawn by test/monitoring/cmd/dashboard-svg (not Grafana) from the %q run of test/e2e TestMonitoringScenario: real talos-ccm, ccm-coordinator and kube-apiserver, %d scrapes, one scenario step per minute.", timeline, steps)))
	for _, p := range d.AllPanels() {
		x := pad + p.GridPos.X*colPx
		y := header + p.GridPos.Y*rowPx
		w := p.GridPos.W*colPx - 8
		h := p.GridPos.H*rowPx - 8
		if p.Type == "row" {
			fmt.Fprintf(&svg, `<text x="%d" y="%d" font-size="14" font-weight="bold" fill="#333">%s</text>`+"\n", x, y+18, esc(p.Title))
			continue
		}
		fmt.Fprintf(&svg, `<g transform="translate(%d,%d)">`+"\n", x, y)
		fmt.Fprintf(&svg, `<rect width="%d" height="%d" rx="3" fill="#fff" stroke="#d8d9da"/>`+"\n", w, h)
		fmt.Fprintf(&svg, `<text x="8" y="18" font-size="12" fill="#333">%s</text>`+"\n", esc(p.Title))
		var series []line
		for _, tg := range p.Targets {
			m, err := monitoring.Range(ctx, e, db, tg.Expr, monitoring.Start, end, monitoring.Step)
			if err != nil {
				return fmt.Errorf("panel %q: %w", p.Title, err)
			}
			for _, s := range m {
				series = append(series, newLine(s, tg.LegendFormat, monitoring.Start, steps))
			}
		}
		slices.SortFunc(series, func(a, b line) int { return strings.Compare(a.name, b.name) })
		switch p.Type {
		case "stat":
			drawStat(&svg, series, w, h)
		default:
			drawLines(&svg, series, steps, w, h, p.Field.Defaults.Unit)
		}
		svg.WriteString("</g>\n")
	}
	svg.WriteString("</svg>\n")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(svg.String()), 0o644)
}

const (
	width = 1200
	pad   = 8
	colPx = (width - 2*pad) / 24
	rowPx = 30
)

var palette = []string{"#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0"}

// line is one series: a value per step (NaN where there is none).
type line struct {
	name   string
	values []float64
}

var legendVar = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

func newLine(s promql.Series, legend string, start time.Time, steps int) line {
	name := legendVar.ReplaceAllStringFunc(legend, func(m string) string {
		return s.Metric.Get(legendVar.FindStringSubmatch(m)[1])
	})
	if strings.TrimSpace(name) == "" {
		name = s.Metric.String()
	}
	l := line{name: strings.TrimSpace(name), values: make([]float64, steps)}
	for i := range l.values {
		l.values[i] = math.NaN()
	}
	for _, f := range s.Floats {
		k := int(time.UnixMilli(f.T).Sub(start) / monitoring.Step)
		if k >= 0 && k < steps {
			l.values[k] = f.F
		}
	}
	return l
}

func last(v []float64) float64 {
	for i := len(v) - 1; i >= 0; i-- {
		if !math.IsNaN(v[i]) {
			return v[i]
		}
	}
	return math.NaN()
}

func drawStat(svg *strings.Builder, series []line, w, h int) {
	text, color := "No data", "#888"
	if len(series) > 0 {
		v := last(series[0].values)
		text = format(v, "")
		color = "#56a64b"
		if v >= 1 {
			color = "#e02f44"
		}
	}
	fmt.Fprintf(svg, `<text x="%d" y="%d" font-size="40" font-weight="bold" text-anchor="middle" fill="%s">%s</text>`+"\n", w/2, h/2+24, color, esc(text))
}

func drawLines(svg *strings.Builder, series []line, steps, w, h int, unit string) {
	const left, top, bottom = 72, 28, 40
	pw, ph := w-left-12, h-top-bottom
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, v := range s.values {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		fmt.Fprintf(svg, `<text x="%d" y="%d" font-size="14" text-anchor="middle" fill="#888">No data</text>`+"\n", w/2, h/2)
		return
	}
	lo = math.Min(lo, 0)
	if hi <= lo {
		hi = lo + 1
	}
	fmt.Fprintf(svg, `<g transform="translate(%d,%d)">`+"\n", left, top)
	for i := 0; i <= 2; i++ {
		y := ph - ph*i/2
		v := lo + (hi-lo)*float64(i)/2
		fmt.Fprintf(svg, `<line x1="0" x2="%d" y1="%d" y2="%d" stroke="#eee"/>`+"\n", pw, y, y)
		fmt.Fprintf(svg, `<text x="-6" y="%d" font-size="10" text-anchor="end" fill="#666">%s</text>`+"\n", y+3, esc(format(v, unit)))
	}
	for _, k := range []int{0, steps / 2, steps - 1} {
		x := pw * k / max(steps-1, 1)
		fmt.Fprintf(svg, `<text x="%d" y="%d" font-size="10" text-anchor="middle" fill="#666">%s</text>`+"\n", x, ph+13, esc(fmt.Sprintf("%+dm", k-(steps-1))))
	}
	for i, s := range series {
		color := palette[i%len(palette)]
		var pts []string
		flush := func() {
			if len(pts) == 1 {
				pts = append(pts, pts[0])
			}
			if len(pts) > 0 {
				fmt.Fprintf(svg, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
			}
			pts = nil
		}
		for k, v := range s.values {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				flush()
				continue
			}
			x := float64(pw) * float64(k) / float64(max(steps-1, 1))
			y := float64(ph) - float64(ph)*(v-lo)/(hi-lo)
			pts = append(pts, strconv.FormatFloat(x, 'f', 1, 64)+","+strconv.FormatFloat(y, 'f', 1, 64))
		}
		flush()
	}
	svg.WriteString("</g>\n")
	// legend: as many as fit on one line
	x := left
	for i, s := range series {
		label := s.name
		if len(label) > 40 {
			label = label[:37] + "..."
		}
		lw := 16 + 6*len(label)
		if x+lw > w-8 {
			fmt.Fprintf(svg, `<text x="%d" y="%d" font-size="10" fill="#666">+%d</text>`+"\n", x, h-8, len(series)-i)
			break
		}
		fmt.Fprintf(svg, `<rect x="%d" y="%d" width="10" height="4" fill="%s"/>`, x, h-14, palette[i%len(palette)])
		fmt.Fprintf(svg, `<text x="%d" y="%d" font-size="10" fill="#444">%s</text>`+"\n", x+14, h-8, esc(label))
		x += lw
	}
}

func format(v float64, unit string) string {
	if math.IsNaN(v) {
		return "NaN"
	}
	var s string
	switch a := math.Abs(v); {
	case a == 0:
		s = "0"
	case a >= 1000:
		s = strconv.FormatFloat(v/1000, 'f', 1, 64) + "k"
	case a >= 10 || a == math.Trunc(a):
		s = strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 0.01:
		s = strconv.FormatFloat(v, 'f', 2, 64)
	default:
		s = strconv.FormatFloat(v, 'g', 2, 64)
	}
	switch unit {
	case "s":
		s += " s"
	case "reqps":
		s += " req/s"
	}
	return s
}

func esc(s string) string { return html.EscapeString(s) }
