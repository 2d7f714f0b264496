package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// maxRequestBody bounds a request body the gate forwards: the API
	// server's own limit for a write (3 MiB, --max-request-body-bytes'
	// default). A native CCM writes Nodes, Services, Events and Leases, each
	// far smaller.
	maxRequestBody = 3 << 20
	// bodyBudget bounds the bytes of all bodies the gate holds at once (the
	// gate container's memory limit is 64 MiB).
	bodyBudget = 16 << 20
	// bodyTimeout bounds the wait for a body's last byte.
	bodyTimeout = 30 * time.Second
)

var (
	// errBodyTooLarge: a request body above maxRequestBody.
	errBodyTooLarge = errors.New("request body too large")
	// errBodyBudget: the bodies in flight hold bodyBudget already.
	errBodyBudget = errors.New("too many request bodies in flight")
	// errBodyTimeout: the body did not arrive within bodyTimeout.
	errBodyTimeout = errors.New("request body not received in time")
)

// newBodyBudget is the budget of a proxy.
func newBodyBudget() *semaphore.Weighted { return semaphore.NewWeighted(bodyBudget) }

// readBody reads r's whole body before anything is forwarded, so the request
// the API server receives has a body of known length the gate already holds.
// Streaming it instead ties the upstream request to the client's connection:
// when the API server answers before it reads the body (a 403 from
// authorization does), Go's HTTP/2 transport waits, on closing the answer,
// for the goroutine still copying the client's body, and the client waits for
// the end of an answer that never comes (seen as a request hanging until the
// client's deadline). The body must arrive within bodyTimeout and fit the
// budget the gate's bodies share; release returns its share once the request
// is done.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) (release func(), err error) {
	release = func() {}
	if r.Body == nil || r.Body == http.NoBody {
		return release, nil
	}
	if r.ContentLength > maxRequestBody {
		return release, fmt.Errorf("%w: %d bytes, at most %d", errBodyTooLarge, r.ContentLength, maxRequestBody)
	}
	// Held for the whole request: the buffer lives until it is forwarded.
	share := int64(maxRequestBody + 1)
	if r.ContentLength >= 0 {
		share = max(r.ContentLength, 1)
	}
	if !p.bodies.TryAcquire(share) {
		return release, fmt.Errorf("%w: the gate holds %d MiB of bodies at most", errBodyBudget, bodyBudget>>20)
	}
	release = func() { p.bodies.Release(share) }
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(bodyTimeout)) == nil
	b, err := readAll(r.Body, r.ContentLength)
	_ = r.Body.Close()
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("%w: %v", errBodyTimeout, bodyTimeout)
		}
		return release, err
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	r.ContentLength = int64(len(b))
	r.TransferEncoding = nil
	if len(b) == 0 {
		r.Body = http.NoBody
		r.Header.Del("Content-Length")
		return release, nil
	}
	r.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return release, nil
}

// readAll reads a body of at most maxRequestBody bytes: into a buffer of its
// declared length when it has one.
func readAll(body io.Reader, length int64) ([]byte, error) {
	if length < 0 {
		b, err := io.ReadAll(io.LimitReader(body, maxRequestBody+1))
		if err != nil {
			return nil, fmt.Errorf("read request body: %w", err)
		}
		if len(b) > maxRequestBody {
			return nil, fmt.Errorf("%w: more than %d bytes", errBodyTooLarge, maxRequestBody)
		}
		return b, nil
	}
	b := make([]byte, length)
	if _, err := io.ReadFull(body, b); err != nil {
		return nil, fmt.Errorf("read request body: %w", err)
	}
	return b, nil
}

// bodyRefused answers a body readBody would not take.
func bodyRefused(w http.ResponseWriter, err error) metav1.Status {
	switch {
	case errors.Is(err, errBodyTooLarge):
		return metav1.Status{Code: http.StatusRequestEntityTooLarge, Reason: metav1.StatusReasonRequestEntityTooLarge, Message: "ccm-gate: " + err.Error()}
	case errors.Is(err, errBodyBudget):
		w.Header().Set("Retry-After", "1")
		return metav1.Status{Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests, Message: "ccm-gate: " + err.Error(),
			Details: &metav1.StatusDetails{RetryAfterSeconds: 1}}
	case errors.Is(err, errBodyTimeout):
		return metav1.Status{Code: http.StatusRequestTimeout, Reason: metav1.StatusReasonTimeout, Message: "ccm-gate: " + err.Error()}
	}
	return badRequest(err)
}

// errAnswerTooLarge: an answer of the API server the gate holds whole to
// check it (one Node, one Service) is larger than the gate holds.
var errAnswerTooLarge = errors.New("the API server's answer is too large for the gate to check")

const (
	// answerBudget bounds the bytes of all the Node answers the gate checks
	// or holds at once, from the first byte read until the last is written
	// to the client (or the answer is dropped). Each is bounded too
	// (maxNodeAnswer); together with the request bodies (bodyBudget) they
	// stay well within the gate container's memory limit (64 MiB), however
	// many reads of however large a Node its client makes at once. A read
	// beyond the budget is answered 429 only when the Node is in the view
	// (budgetRefused): the refusal of an answer showing a Node outside the
	// view, or of a larger answer than a Node that is gone has, would tell
	// the two apart.
	answerBudget = 24 << 20
	// answerChunk is the least share of the budget an answer of unknown
	// length takes at a time.
	answerChunk = 64 << 10
)

// errAnswerBudget: the answers the gate holds take answerBudget already.
var errAnswerBudget = errors.New("too many answers of the API server in flight")

// newAnswerBudget is the budget of a proxy.
func newAnswerBudget() *semaphore.Weighted { return semaphore.NewWeighted(answerBudget) }

// answer is an answer of the API server read whole, holding its share of
// the answer budget until release.
type answer struct {
	body   []byte
	budget *semaphore.Weighted
	share  int64
	once   sync.Once
}

// release returns the answer's share of the budget (once; later calls do
// nothing).
func (a *answer) release() {
	a.once.Do(func() {
		if a.share > 0 {
			a.budget.Release(a.share)
		}
	})
}

// take adds n bytes to the answer's share of the budget.
func (a *answer) take(n int64) error {
	if !a.budget.TryAcquire(n) {
		return fmt.Errorf("%w: the gate holds %d MiB of answers at most", errAnswerBudget, answerBudget>>20)
	}
	a.share += n
	return nil
}

// readWhole reads body whole (at most limit bytes; length is its declared
// length, -1 for unknown), every byte within the answer budget: an answer of
// known length takes its share at once, one of unknown length as its buffer
// grows. On an error nothing is held.
func readWhole(budget *semaphore.Weighted, body io.Reader, length int64, limit int) (*answer, error) {
	a := &answer{budget: budget}
	if length > int64(limit) {
		return nil, fmt.Errorf("%w: %d bytes, more than %d MiB", errAnswerTooLarge, length, limit>>20)
	}
	if length >= 0 {
		if err := a.take(max(length, 1)); err != nil {
			return nil, err
		}
		a.body = make([]byte, length)
		if _, err := io.ReadFull(body, a.body); err != nil {
			a.release()
			return nil, fmt.Errorf("read the API server's answer: %w", err)
		}
		return a, nil
	}
	var b []byte
	for {
		if len(b) == cap(b) {
			if len(b) > limit {
				a.release()
				return nil, fmt.Errorf("%w: more than %d MiB", errAnswerTooLarge, limit>>20)
			}
			grow := min(max(cap(b), answerChunk), limit+1-cap(b))
			if err := a.take(int64(grow)); err != nil {
				a.release()
				return nil, err
			}
			nb := make([]byte, len(b), cap(b)+grow)
			copy(nb, b)
			b = nb
		}
		n, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			a.release()
			return nil, fmt.Errorf("read the API server's answer: %w", err)
		}
	}
	if len(b) > limit {
		a.release()
		return nil, fmt.Errorf("%w: more than %d MiB", errAnswerTooLarge, limit>>20)
	}
	if spare := cap(b) - len(b); spare >= answerChunk/16 {
		// the buffer grew by doubling: keep what the answer needs
		b = append(make([]byte, 0, max(len(b), 1)), b...)
		a.budget.Release(int64(spare))
		a.share -= int64(spare)
	}
	a.body = b
	return a, nil
}

// readAnswer reads (and closes) an answer of the API server that the gate
// holds whole: at most limit bytes.
func readAnswer(body io.ReadCloser, limit int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	_ = body.Close()
	if err != nil {
		return nil, fmt.Errorf("read the API server's answer: %w", err)
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%w: more than %d MiB", errAnswerTooLarge, limit>>20)
	}
	return b, nil
}

// readNodeAnswer reads (and closes) a Node answer that the gate checks or
// holds: at most maxNodeAnswer bytes, within the answer budget. The caller
// releases it, or hands it to setAnswerBody.
func (p *Proxy) readNodeAnswer(resp *http.Response) (*answer, error) {
	a, err := readWhole(p.answers, resp.Body, resp.ContentLength, maxNodeAnswer)
	_ = resp.Body.Close()
	return a, err
}

// setAnswerBody makes body, read whole, the answer's body; a's share of the
// answer budget returns when the body is closed (the reverse proxy closes it
// once written, or on failing to).
func setAnswerBody(resp *http.Response, body []byte, a *answer) {
	resp.Body = &answerBody{Reader: bytes.NewReader(body), a: a}
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
}

type answerBody struct {
	*bytes.Reader
	a *answer
}

func (b *answerBody) Close() error {
	b.a.release()
	return nil
}

// tooManyAnswers answers a request whose answer the gate would hold beyond
// answerBudget: the client reads again (client-go does, after Retry-After).
func tooManyAnswers(w http.ResponseWriter, err error) metav1.Status {
	w.Header().Set("Retry-After", "1")
	return metav1.Status{Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests, Message: "ccm-gate: " + err.Error(),
		Details: &metav1.StatusDetails{RetryAfterSeconds: 1}}
}
