// Package writefloor gives the benchmarks of talos-ccm's controllers the floor
// their figures are compared to: the least time the API server needs for the
// writes it served while a figure was measured.
//
// The writes are counted by the API server itself (apiserver_request_total, by
// verb, resource and subresource), so a controller's extra or retried requests
// show up whether or not the benchmark expected them. They are priced at the
// API server's parallel write ceiling for them: the same writes, on objects of
// the same shape, issued the way the figure issues them (Stage: as many
// concurrent workers as talos-ccm uses for each kind, as many as the benchmark
// for its own writes such as registrations, an object's writes in the same
// order) but with nothing else to do, against the same API server in the same
// run (the fastest of a few rounds, see Best). The floor is the number of
// writes ÷ the ceiling's rate, summed over the ceilings.
//
// It measures and reports; it never asserts times (tests do not time things).
package writefloor

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
)

// Kind is one kind of write as the API server counts it: the HTTP verb
// (POST, PUT, PATCH, DELETE, APPLY), the resource and the subresource.
type Kind struct {
	Verb, Resource, Subresource string
}

func (k Kind) String() string {
	if k.Subresource == "" {
		return k.Verb + " " + k.Resource
	}
	return k.Verb + " " + k.Resource + "/" + k.Subresource
}

// Counts are writes served, by kind.
type Counts map[Kind]float64

// writeVerbs are the apiserver_request_total verbs that change state.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true}

// Served returns the writes the API server has answered since it started (any
// response code: a conflict costs the server a request too).
func Served(ctx context.Context, c kubernetes.Interface) (Counts, error) {
	const op = "writefloor.Served"
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: read the API server's metrics: %w", op, err)
	}
	return parse(string(raw))
}

// parse reads the apiserver_request_total samples of a Prometheus text
// exposition.
func parse(text string) (Counts, error) {
	const op = "writefloor.parse"
	out := Counts{}
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return nil, fmt.Errorf("%s: malformed sample %q", op, line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: sample %q: %w", op, line, err)
		}
		var k Kind
		for pair := range strings.SplitSeq(labels, ",") {
			name, quoted, _ := strings.Cut(pair, "=")
			val := strings.Trim(quoted, `"`)
			switch name {
			case "verb":
				k.Verb = val
			case "resource":
				k.Resource = val
			case "subresource":
				k.Subresource = val
			}
		}
		if writeVerbs[k.Verb] {
			out[k] += v
		}
	}
	return out, nil
}

// Since returns the writes served between before and c.
func (c Counts) Since(before Counts) Counts {
	out := Counts{}
	for k, v := range c {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Total is the number of writes in c.
func (c Counts) Total() float64 {
	var t float64
	for _, v := range c {
		t += v
	}
	return t
}

func (c Counts) String() string {
	if len(c) == 0 {
		return "none"
	}
	kinds := make([]Kind, 0, len(c))
	for k := range c {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b Kind) int { return strings.Compare(a.String(), b.String()) })
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%.0f %s", c[k], k)
	}
	return strings.Join(parts, ", ")
}

// Window counts the writes the API server serves between its start and Close.
type Window struct {
	client kubernetes.Interface
	before Counts
}

// Open starts counting.
func Open(b testing.TB, c kubernetes.Interface) *Window {
	b.Helper()
	before, err := Served(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return &Window{client: c, before: before}
}

// Close returns the writes served since Open.
func (w *Window) Close(b testing.TB) Counts {
	b.Helper()
	after, err := Served(context.Background(), w.client)
	if err != nil {
		b.Fatal(err)
	}
	return after.Since(w.before)
}

// Stage is one step of the writes a figure makes per object, issued like the
// figure issues them: Workers goroutines each take an object that the previous
// stage has written (the first stage: any object) and call Write, which makes
// the writes of Kinds, in that order.
type Stage struct {
	Kinds   []Kind
	Workers int
	Write   func(i int) error
	// Trailing marks a stage the figure's clock does not wait for (a
	// controller's event writers): the ceiling's clock does not either, and
	// only the writes it finished by then count.
	Trailing bool
}

func (s Stage) String() string {
	var kinds []string
	for i := 0; i < len(s.Kinds); {
		j := i + 1
		for j < len(s.Kinds) && s.Kinds[j] == s.Kinds[i] {
			j++
		}
		if j-i > 1 {
			kinds = append(kinds, fmt.Sprintf("%d %s", j-i, s.Kinds[i]))
		} else {
			kinds = append(kinds, s.Kinds[i].String())
		}
		i = j
	}
	return fmt.Sprintf("%s (%d workers)", strings.Join(kinds, " + "), s.Workers)
}

// Ceiling is the API server's measured parallel rate for some kinds of
// write, issued together as Stages describe.
type Ceiling struct {
	Stages []Stage
	// Writes were served in Elapsed.
	Writes  int
	Elapsed time.Duration
	// Rounds is how many measurements this one is the fastest of (Best).
	Rounds int
}

// Kinds are the kinds of write the ceiling prices.
func (c Ceiling) Kinds() []Kind {
	var out []Kind
	for _, s := range c.Stages {
		out = append(out, s.Kinds...)
	}
	return out
}

// Rate is writes per second.
func (c Ceiling) Rate() float64 { return float64(c.Writes) / c.Elapsed.Seconds() }

func (c Ceiling) key() string {
	stages := make([]string, len(c.Stages))
	for i, s := range c.Stages {
		stages[i] = s.String()
	}
	return strings.Join(stages, " → ")
}

func (c Ceiling) String() string {
	if c.Rounds > 1 {
		return fmt.Sprintf("%s: %.0f writes/s (best of %d)", c.key(), c.Rate(), c.Rounds)
	}
	return fmt.Sprintf("%s: %.0f writes/s", c.key(), c.Rate())
}

// Best keeps, of the measurements of each ceiling, the fastest: a
// ceiling is the most the API server did, and on shared machines a round
// that other work slowed down says little about it. Rounds taken before and
// after a figure bracket it.
func Best(rounds ...Ceiling) []Ceiling {
	var out []Ceiling
	for _, c := range rounds {
		i := slices.IndexFunc(out, func(o Ceiling) bool { return o.key() == c.key() })
		if i < 0 {
			c.Rounds = 1
			out = append(out, c)
			continue
		}
		n := out[i].Rounds + 1
		if c.Rate() > out[i].Rate() {
			out[i] = c
		}
		out[i].Rounds = n
	}
	return out
}

// Measure issues write(0) … write(n-1), one write of kind each, from workers
// goroutines and returns the rate at which the API server served them. It
// fails b on the first error.
func Measure(b testing.TB, kind Kind, n, workers int, write func(i int) error) Ceiling {
	b.Helper()
	return MeasureStages(b, n, Stage{Kinds: []Kind{kind}, Workers: workers, Write: write})
}

// MeasureStages passes objects 0 … n-1 through the stages and returns the rate
// at which the API server served their writes, from the first write until
// every object has been through every stage that is not trailing. It fails b
// on the first error.
func MeasureStages(b testing.TB, n int, stages ...Stage) Ceiling {
	b.Helper()
	var (
		wg      sync.WaitGroup
		once    sync.Once
		first   error
		written atomic.Int64
		clock   sync.WaitGroup // the stages the clock waits for
	)
	fail := func(err error) { once.Do(func() { first = err }) }
	in := make(chan int, n)
	for i := range n {
		in <- i
	}
	close(in)
	start := time.Now()
	for _, s := range stages {
		src, out := in, make(chan int, n)
		var stage sync.WaitGroup
		if !s.Trailing {
			clock.Add(1)
		}
		for range s.Workers {
			stage.Add(1)
			wg.Go(func() {
				defer stage.Done()
				for i := range src {
					if err := s.Write(i); err != nil {
						fail(fmt.Errorf("%s: %w", s, err))
						continue // the later stages do not see this object
					}
					written.Add(int64(len(s.Kinds)))
					out <- i
				}
			})
		}
		go func() {
			stage.Wait()
			close(out)
			if !s.Trailing {
				clock.Done()
			}
		}()
		in = out
	}
	clock.Wait()
	elapsed, writes := time.Since(start), written.Load()
	wg.Wait()
	if first != nil {
		b.Fatalf("ceiling: %v", first)
	}
	return Ceiling{Stages: stages, Writes: int(writes), Elapsed: elapsed}
}

// Floor is the least time the API server needs for the writes of a window at
// the measured ceilings.
type Floor struct {
	// Writes are the writes served during the figure.
	Writes Counts
	// Ceilings price the kinds of write; a kind without one is unpriced
	// (reported, not counted in the floor). A kind is priced by the first
	// ceiling that has it.
	Ceilings []Ceiling
	// Objects is what the figure is about (nodes, CSRs): writes are given
	// per object.
	Objects int
}

func (f Floor) ceiling(k Kind) (int, bool) {
	for i, c := range f.Ceilings {
		if slices.Contains(c.Kinds(), k) {
			return i, true
		}
	}
	return 0, false
}

// Duration is Σ over the ceilings of the window's writes of their kinds ÷
// their rate.
func (f Floor) Duration() time.Duration {
	writes := make([]float64, len(f.Ceilings))
	for k, n := range f.Writes {
		if i, ok := f.ceiling(k); ok {
			writes[i] += n
		}
	}
	var s float64
	for i, c := range f.Ceilings {
		s += writes[i] / c.Rate()
	}
	return time.Duration(s * float64(time.Second))
}

// Priced are the writes the floor accounts for; Unpriced the others (the API
// server's own lease renewals, anything unexpected).
func (f Floor) Priced() Counts   { return f.split(true) }
func (f Floor) Unpriced() Counts { return f.split(false) }

func (f Floor) split(priced bool) Counts {
	out := Counts{}
	for k, n := range f.Writes {
		if _, ok := f.ceiling(k); ok == priced {
			out[k] = n
		}
	}
	return out
}

// Report records the figure, the floor, the writes per object and the ratio
// as benchmark metrics named after name, and returns the same as a line to
// print.
func (f Floor) Report(b *testing.B, name string, figure time.Duration) string {
	b.Helper()
	floor := f.Duration()
	perObject := f.Priced().Total() / float64(f.Objects)
	ratio := figure.Seconds() / floor.Seconds()
	b.ReportMetric(figure.Seconds(), name+"-s")
	b.ReportMetric(floor.Seconds(), name+"-floor-s")
	b.ReportMetric(perObject, name+"-writes/object")
	b.ReportMetric(ratio, name+"-x-floor")
	ceilings := make([]string, len(f.Ceilings))
	for i, c := range f.Ceilings {
		ceilings[i] = c.String()
	}
	line := fmt.Sprintf("%s: %s for %d objects; writes served meanwhile: %s (%.2f per object); ceilings: %s; floor %s; %.2fx the floor",
		name, figure.Round(time.Millisecond), f.Objects, f.Priced(), perObject, strings.Join(ceilings, ", "),
		floor.Round(time.Millisecond), ratio)
	if u := f.Unpriced(); len(u) > 0 {
		line += fmt.Sprintf(" (not priced: %s)", u)
	}
	return line
}
