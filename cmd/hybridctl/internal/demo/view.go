package demo

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/names"
)

// view renders the demo state: a table redrawn in place (interactive) or a line
// per change (log mode, e.g. in CI).
type view struct {
	out         io.Writer
	interactive bool
	start       time.Time
	steps       []string
	last        map[string]string
	// drawn is set once the live table is on screen (interactive)
	drawn bool
	// size returns the terminal's width and height (nil or zero: unknown)
	size func() (width, height int)
	// kubectl is the command that points kubectl at the cluster (once up).
	kubectl string
	// reached is the end state, once reached (the demo then runs on until
	// Ctrl-C).
	reached string
}

func newView(out io.Writer, interactive bool) *view {
	return &view{out: out, interactive: interactive, start: time.Now(), last: map[string]string{}}
}

func (v *view) elapsed() string { return time.Since(v.start).Truncate(100 * time.Millisecond).String() }

// step records a stage of the demo. The live table lists the stages; until it
// is first drawn (the control plane takes a while to start) they are printed.
func (v *view) step(s string) {
	v.steps = append(v.steps, s)
	switch {
	case !v.interactive:
		fmt.Fprintf(v.out, "[%7s] %s\n", v.elapsed(), s)
	case !v.drawn:
		fmt.Fprintf(v.out, "  … %s\n", s)
	}
}

// detail prints a line of a step's progress (the cluster's, the fleet's)
// until the live table is drawn.
func (v *view) detail(s string) {
	switch {
	case !v.interactive:
		fmt.Fprintf(v.out, "[%7s]   %s\n", v.elapsed(), s)
	case !v.drawn:
		fmt.Fprintf(v.out, "      %s\n", s)
	}
}

// note prints a line in both modes, below the live table when there is one
// (used while stopping, when the table is no longer redrawn).
func (v *view) note(s string) {
	if v.interactive {
		fmt.Fprintf(v.out, "%s\n", s)
		return
	}
	fmt.Fprintf(v.out, "[%7s] %s\n", v.elapsed(), s)
}

func bar(done, total int) string {
	const width = 20
	if total == 0 {
		return strings.Repeat("░", width)
	}
	n := done * width / total
	return strings.Repeat("█", n) + strings.Repeat("░", width-n)
}

// serviceLines are, per demo Service, its name and which cloud's load
// balancer serves it, at which address, with which nodes as targets.
func serviceLines(s *state) [][2]string {
	var out [][2]string
	for _, d := range demoServices {
		class := d.class
		if class == "" {
			class = "no class"
		}
		line := "(" + class + ") waiting for an address"
		for _, lb := range s.lbs {
			if lb.Service != shopNamespace+"/"+d.name {
				continue
			}
			line = fmt.Sprintf("(%s) %s from the %s cloud's load balancer, targets %s", class, lb.IP, lb.Provider, strings.Join(lb.Nodes, ", "))
			if i := slices.IndexFunc(s.services, func(v corev1.Service) bool { return v.Name == d.name }); i < 0 || len(s.services[i].Status.LoadBalancer.Ingress) == 0 {
				line += " (status not written yet)"
			}
		}
		out = append(out, [2]string{shopNamespace + "/" + d.name, line})
	}
	return out
}

func (v *view) render(s *state) {
	initDone, approved, denied := s.counts()
	if !v.interactive {
		for i := range s.nodes {
			n := &s.nodes[i]
			line := "waiting for talos-ccm"
			if initialized(n) {
				line = fmt.Sprintf("initialized: platform=%s providerID=%s zone=%s podCIDRs=%s", n.Labels[names.PlatformLabel],
					n.Spec.ProviderID, n.Labels["topology.kubernetes.io/zone"], strings.Join(n.Spec.PodCIDRs, ","))
			}
			if st := nodeStatus(n); st != "Ready" {
				line += " — " + st
			}
			v.changed("node/"+n.Name, line)
		}
		for _, name := range s.deleted() {
			v.changed("node/"+name, deletedLine(s, name))
		}
		for i := range s.csrs {
			d, reason := csrDecision(&s.csrs[i])
			if reason != "" {
				d += " (" + reason + ")"
			}
			v.changed("csr/"+s.csrs[i].Name, d+" — filed by "+s.csrs[i].Spec.Username)
		}
		for i := range s.natives {
			v.changed("nativeccm/"+s.natives[i].Name, nativeLine(&s.natives[i]))
		}
		for _, p := range s.probes {
			v.changed("gate/delete node/"+p.Target, probeLine(p))
		}
		for _, line := range serviceLines(s) {
			v.changed("service/"+line[0], line[1])
		}
		for _, q := range s.questions {
			if lbCall(q) {
				v.changed("aws-api/"+q.About, "called by the (upstream) aws CCM's service controller for its Classic ELB")
				continue
			}
			what := "asked by the " + q.Provider + " CCM: does the instance exist, is it shut down?"
			if q.Provider == "aws" {
				what = "asked EC2 by the (upstream) aws CCM: does the instance exist, is it shut down?"
			}
			if q.Foreign {
				what += " — NOT ITS OWN NODE"
			}
			v.changed("cloud/"+q.Provider+"/"+q.About, what)
		}
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Hybrid CCM demo — %s   (Ctrl-C to stop and clean up)\n", v.elapsed())
	if v.kubectl != "" {
		fmt.Fprintf(&b, "  kubectl (as root): %s get nodes\n", v.kubectl)
	}
	b.WriteString("\n")
	for _, st := range v.steps {
		fmt.Fprintf(&b, "  ✓ %s\n", st)
	}
	if v.reached != "" {
		fmt.Fprintf(&b, "\n  END STATE REACHED (Ctrl-C stops the demo and cleans up): %s\n", v.reached)
	}
	fmt.Fprintf(&b, "\n  nodes initialized %s %d/%d    serving certificates approved %s %d/%d    CSRs denied %d    native CCMs running %s %d/%d\n\n",
		bar(initDone, s.expected), initDone, s.expected, bar(approved, s.expected), approved, s.expected, denied,
		bar(s.readyNatives(), len(demoClouds)), s.readyNatives(), len(demoClouds))
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODE\tPLATFORM\tPROVIDER ID\tZONE\tTYPE\tPOD CIDRS\tSTATUS\tEXTRA LABELS")
	for i := range s.nodes {
		n := &s.nodes[i]
		if !initialized(n) {
			fmt.Fprintf(tw, "  %s\t…\t(uninitialized)\t\t\t\t%s\t\n", n.Name, nodeStatus(n))
			continue
		}
		var extra []string
		for k, val := range n.Labels {
			if strings.HasPrefix(k, "node-role.") || strings.HasPrefix(k, "example.com/") || strings.HasSuffix(k, "/lifecycle") {
				extra = append(extra, k+"="+val)
			}
		}
		sort.Strings(extra)
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Labels[names.PlatformLabel],
			n.Spec.ProviderID, n.Labels["topology.kubernetes.io/zone"], n.Labels["node.kubernetes.io/instance-type"],
			strings.Join(n.Spec.PodCIDRs, ","), nodeStatus(n), strings.Join(extra, ","))
	}
	// who deleted a node goes in the last column: in STATUS it would widen
	// that column for every row
	for _, name := range s.deleted() {
		by := ""
		if ev, ok := s.deleting[name]; ok {
			by = "by " + ev.who() + " (not in its cloud)"
		}
		fmt.Fprintf(tw, "  %s\t\t(gone)\t\t\t\tdeleted\t%s\n", name, by)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "  CSR\tREQUESTOR\tDECISION\tREASON\t\t\t\t")
	for _, r := range csrRows(s) {
		d, reason := csrDecision(r.csr)
		name := r.csr.Name
		if r.earlier > 0 {
			name += fmt.Sprintf(" (+%d earlier)", r.earlier)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t\t\t\t\n", name, r.csr.Spec.Username, d, reason)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "  NATIVECCM\tDOMAIN\tNODES\tRELEASE\tLEADER (POD)\tSTATUS\t\t")
	for i := range s.natives {
		n := &s.natives[i]
		rel, leader := "-", "-"
		if n.Status.Release != nil {
			rel = fmt.Sprintf("%s rev %d (%s)", n.Status.Release.Name, n.Status.Release.Revision, n.Status.Release.Chart)
		}
		if n.Status.Leader != nil && n.Status.Leader.Pod != "" {
			leader = n.Status.Leader.Pod
		}
		_, why := nativeReady(n)
		if nativeRunning(n) {
			why = "running, gated — " + why
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t\t\n", n.Name, domainText(n), n.Status.Nodes, rel, leader, why)
	}
	if len(s.probes) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "  GATE: DELETE AS\tNODE\tDECISION\t\t\t\t\t")
		for _, p := range s.probes {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t\t\t\t\t\n", p.Who[strings.LastIndex(p.Who, ":")+1:], p.Target, shortProbeLine(p))
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "  SERVICE\tLOAD BALANCER\t\t\t\t\t\t")
	for _, line := range serviceLines(s) {
		fmt.Fprintf(tw, "  %s\t%s\t\t\t\t\t\t\n", line[0], line[1])
	}
	if s.outage {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "  CLOUD API\tASKED ABOUT\tTIMES\t\t\t\t\t")
		for _, q := range s.questions {
			about := q.About
			if q.Foreign {
				about += " (NOT ITS OWN)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t\t\t\t\t\n", q.Provider, about, q.Times)
		}
		if len(s.questions) == 0 {
			fmt.Fprintln(tw, "  (none yet)\t\t\t\t\t\t\t")
		}
	}
	_ = tw.Flush()
	v.redraw(b.String())
}

// nodeStatus is the node's Ready condition and the shutdown taint.
func nodeStatus(n *corev1.Node) string {
	st := "Ready"
	switch nodeReady(n) {
	case corev1.ConditionFalse:
		st = "NotReady"
	case corev1.ConditionUnknown:
		st = "NotReady (kubelet silent)"
	}
	if hasShutdownTaint(n) {
		st += ", tainted shutdown"
	}
	return st
}

// deleted are the nodes seen initialized that are gone now.
func (s *state) deleted() []string {
	var out []string
	for name := range s.initialized {
		if s.node(name) == nil {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func deletedLine(s *state, name string) string {
	if ev, ok := s.deleting[name]; ok {
		return "deleted — " + ev.who() + ": " + ev.message
	}
	return "deleted"
}

// redraw replaces the screen with frame without clearing it first (no
// flicker): cursor home, each line overwritten and its rest erased, then
// everything below erased. The first frame clears the screen.
func (v *view) redraw(frame string) {
	var b strings.Builder
	if !v.drawn {
		b.WriteString("\x1b[H\x1b[2J")
		v.drawn = true
	} else {
		b.WriteString("\x1b[H")
	}
	lines := strings.Split(strings.TrimRight(frame, "\n"), "\n")
	width, height := 0, 0
	if v.size != nil {
		width, height = v.size()
	}
	// a frame taller than the terminal would scroll and the next frame
	// would not overwrite it: cut it, and cut lines that would wrap
	if height > 1 && len(lines) > height-1 {
		lines = append(lines[:height-2], "  … (enlarge the terminal to see the rest)")
	}
	for _, line := range lines {
		b.WriteString(clip(strings.TrimRight(line, " "), width-1))
		b.WriteString("\x1b[K\n")
	}
	b.WriteString("\x1b[J")
	fmt.Fprint(v.out, b.String())
}

// clip shortens s to at most width runes (every rune the view prints is one
// column wide), ending it with "…"; width <= 0 means no limit.
func clip(s string, width int) string {
	r := []rune(s)
	if width <= 0 || len(r) <= width {
		return s
	}
	return string(r[:width-1]) + "…"
}

func (v *view) changed(key, line string) {
	if v.last[key] == line {
		return
	}
	v.last[key] = line
	fmt.Fprintf(v.out, "[%7s] %-28s %s\n", v.elapsed(), key, line)
}

func (v *view) summary(s *state) {
	fmt.Fprintf(v.out, "\n%s\n", s.pending())
	if err := s.Check(); err != nil {
		fmt.Fprintf(v.out, "not as expected:\n%v\n", err)
	}
}

func nativeLine(n *v1alpha1.NativeCCM) string {
	ok, why := nativeReady(n)
	if nativeRunning(n) {
		return fmt.Sprintf("running: release %s rev %d, lease held by pod %s, gated, %d node(s) of its domain (%s), lifecycle-only",
			n.Status.Release.Name, n.Status.Release.Revision, n.Status.Leader.Pod, n.Status.Nodes, domainText(n))
	}
	if ok {
		return "Ready, not yet gated or without a leader: " + why
	}
	return why
}

// domainText is the nodes a NativeCCM owns: its platform's, narrowed by its
// domain selector ("aws, topology.kubernetes.io/region=us-east-1").
func domainText(n *v1alpha1.NativeCCM) string {
	out := []string{n.Spec.Platform}
	if n.Spec.Domain == nil || n.Spec.Domain.Selector == nil {
		return out[0] + " (all its nodes)"
	}
	sel := n.Spec.Domain.Selector
	for _, k := range slices.Sorted(maps.Keys(sel.MatchLabels)) {
		out = append(out, k+"="+sel.MatchLabels[k])
	}
	for _, e := range sel.MatchExpressions {
		out = append(out, fmt.Sprintf("%s %s (%s)", e.Key, strings.ToLower(string(e.Operator)), strings.Join(e.Values, ",")))
	}
	return strings.Join(out, ", ")
}

// shortProbeLine is probeLine without the API server's preamble ("nodes ... is
// forbidden: ValidatingAdmissionPolicy ... denied request: "), for the table.
func shortProbeLine(p gateProbe) string {
	if p.Allowed {
		return "allowed"
	}
	msg := p.Message
	if _, rest, ok := strings.Cut(msg, "denied request: "); ok {
		msg = rest
	}
	return "denied: " + msg
}

func probeLine(p gateProbe) string {
	if p.Allowed {
		return "allowed"
	}
	return "denied: " + p.Message
}

// who names the client that recorded the event: the CCM binary (its field
// manager) and the controller, or the controller alone.
func (e nodeEvent) who() string {
	if e.manager != "" && e.manager != e.component {
		return e.manager + " " + e.component
	}
	return e.component
}

// csrRow is one line of the table's CSRs: a requestor's newest CSR and how
// many it filed before (a kubelet files again when its addresses change),
// or the forged one.
type csrRow struct {
	csr     *certificatesv1.CertificateSigningRequest
	earlier int
}

// csrRows are the table's CSRs: per requestor its newest (the CSRs are
// ordered by requestor, then as filed), the forged one on its own.
func csrRows(s *state) []csrRow {
	var rows []csrRow
	row := map[string]int{} // requestor → its row
	for i := range s.csrs {
		c := &s.csrs[i]
		if j, ok := row[c.Spec.Username]; ok && c.Name != forgedCSR {
			rows[j] = csrRow{csr: c, earlier: rows[j].earlier + 1}
			continue
		}
		if c.Name != forgedCSR {
			row[c.Spec.Username] = len(rows)
		}
		rows = append(rows, csrRow{csr: c})
	}
	return rows
}
