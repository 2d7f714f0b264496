package proxy

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadWhole: an answer read whole takes its bytes from the answer
// budget, of known length at once and of unknown length as it grows, gives
// them back on release (once), and holds nothing when it fails: too large,
// beyond the budget, or broken off.
func TestReadWhole(t *testing.T) {
	budget := newAnswerBudget()
	idle := func() bool {
		if !budget.TryAcquire(answerBudget) {
			return false
		}
		budget.Release(answerBudget)
		return true
	}
	body := strings.Repeat("n", 3<<20)
	for _, length := range []int64{int64(len(body)), -1} {
		var held []*answer
		for {
			a, err := readWhole(budget, strings.NewReader(body), length, 8<<20)
			if errors.Is(err, errAnswerBudget) {
				break
			}
			if err != nil || string(a.body) != body {
				t.Fatalf("length %d: %v", length, err)
			}
			if held = append(held, a); len(held) > answerBudget/len(body) {
				t.Fatalf("length %d: %d answers of %d MiB held within %d MiB", length, len(held), len(body)>>20, answerBudget>>20)
			}
		}
		if len(held) < answerBudget/len(body)-2 {
			t.Errorf("length %d: only %d answers of %d MiB held within %d MiB", length, len(held), len(body)>>20, answerBudget>>20)
		}
		for _, a := range held {
			a.release()
			a.release()
		}
		if !idle() {
			t.Fatalf("length %d: the budget is not whole after every answer was released", length)
		}
	}
	for _, tc := range []struct {
		what          string
		r             io.Reader
		length, limit int
		want          error
	}{
		{"too large, known", strings.NewReader(body), len(body), 1 << 20, errAnswerTooLarge},
		{"too large, unknown", strings.NewReader(body), -1, 1 << 20, errAnswerTooLarge},
		{"broken off, known", io.MultiReader(strings.NewReader(body[:100<<10]), iotest.ErrReader(iotest.ErrTimeout)), len(body), 8 << 20, iotest.ErrTimeout},
		{"broken off, unknown", io.MultiReader(strings.NewReader(body[:100<<10]), iotest.ErrReader(iotest.ErrTimeout)), -1, 8 << 20, iotest.ErrTimeout},
		{"shorter than declared", strings.NewReader("abc"), 4, 8 << 20, io.ErrUnexpectedEOF},
	} {
		if _, err := readWhole(budget, tc.r, int64(tc.length), tc.limit); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.what, err, tc.want)
		}
		if !idle() {
			t.Fatalf("%s: the budget is not whole after the read failed", tc.what)
		}
	}
	if a, err := readWhole(budget, strings.NewReader(""), -1, 1<<20); err != nil || len(a.body) != 0 {
		t.Errorf("empty: %v", err)
	} else {
		a.release()
	}
}
